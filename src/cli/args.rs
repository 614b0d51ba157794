//! Flag groups shared by the commands that generate text (`run`, `chat`, `serve`): flatten them into a command's
//! `Args` with `#[command(flatten)]`.
//!
//! Every numeric flag is checked at parse time, so `--temp nan` or `--top-p 1.5` fails with a message naming the
//! flag and the allowed range before any model is loaded.

use std::num::NonZeroUsize;
use std::sync::Arc;

use clap::{Args, ValueEnum};

use crate::sampling::{
    BIAS_LIMIT, DryParams, DynatempParams, LogitBias, MirostatParams, SamplerOrder, SamplingParams, XtcParams,
    random_seed,
};
use crate::speculative::{DraftParams, MAX_DRAFT};
use crate::stop::{StopError, StopMatcher, parse_stop};
use crate::structured::{Grammar, JsonSchema, OutputFormat};

const D: SamplingParams = SamplingParams::DEFAULT;

// How the next token is chosen. (A plain comment: a doc comment on a flattened
// `Args` struct would replace the `about` text of the command that flattens it.)
#[derive(Args, Debug, Clone, PartialEq)]
pub struct SamplingArgs {
    /// Temperature: higher is more random; 0 = greedy (always the most likely token).
    #[arg(long = "temp", value_name = "T", default_value_t = D.temperature, value_parser = parse_temperature,
          allow_negative_numbers = true, help_heading = "Sampling")]
    pub temperature: f32,
    /// Sample only among the K most likely tokens; 0 = off.
    #[arg(long, value_name = "K", default_value_t = D.top_k, value_parser = parse_count,
          allow_negative_numbers = true, help_heading = "Sampling")]
    pub top_k: usize,
    /// Nucleus sampling: only the most likely tokens whose probabilities add up to P, in (0, 1]; 1 = off.
    #[arg(long, value_name = "P", default_value_t = D.top_p, value_parser = parse_top_p,
          allow_negative_numbers = true, help_heading = "Sampling")]
    pub top_p: f32,
    /// Drop tokens less likely than P times the most likely one, in [0, 1]; 0 = off.
    #[arg(long, value_name = "P", default_value_t = D.min_p, value_parser = parse_min_p,
          allow_negative_numbers = true, help_heading = "Sampling")]
    pub min_p: f32,
    /// Top-nσ: keep only tokens whose logit is within N standard deviations (of all the logits) of the largest, a
    /// cut that does not move with the temperature; <= 0 = off (-1, llama.cpp's default). 1 is a common setting.
    #[arg(long, value_name = "N", default_value_t = D.top_n_sigma, value_parser = parse_float,
          allow_negative_numbers = true, help_heading = "Sampling")]
    pub top_n_sigma: f32,
    /// Penalize tokens seen among the last --repeat-last-n: > 0, 1 = off, above 1 discourages repeats.
    #[arg(long, value_name = "X", default_value_t = D.repeat_penalty, value_parser = parse_repeat_penalty,
          allow_negative_numbers = true, help_heading = "Sampling")]
    pub repeat_penalty: f32,
    /// How many recent tokens the penalties look at; 0 = off.
    #[arg(long, value_name = "N", default_value_t = D.repeat_last_n, value_parser = parse_count,
          allow_negative_numbers = true, help_heading = "Sampling")]
    pub repeat_last_n: usize,
    /// Subtract X from the logit of every token seen among the last --repeat-last-n, in [-2, 2]; 0 = off.
    #[arg(long, value_name = "X", default_value_t = D.presence_penalty, value_parser = parse_penalty,
          allow_negative_numbers = true, help_heading = "Sampling")]
    pub presence_penalty: f32,
    /// Subtract X from a token's logit for each time it occurs among the last --repeat-last-n, in [-2, 2]; 0 = off.
    #[arg(long, value_name = "X", default_value_t = D.frequency_penalty, value_parser = parse_penalty,
          allow_negative_numbers = true, help_heading = "Sampling")]
    pub frequency_penalty: f32,
    /// Add BIAS to token ID's logit: ID+BIAS or ID-BIAS, BIAS up to 100; ID-inf bans the token. Repeatable (llama.cpp's
    /// syntax; `infer tokenize` shows a text's ids).
    #[arg(long, short = 'l', value_name = "ID(+|-)BIAS", value_parser = parse_logit_bias, help_heading = "Sampling")]
    pub logit_bias: Vec<(u32, f32)>,
    /// DRY: penalize a token that would carry on a repeat of --dry-allowed-length or more tokens, by
    /// X × --dry-base^(repeat − allowed length); 0 = off, 0.8 is the usual setting. Stops loops, spares single words.
    #[arg(long, value_name = "X", default_value_t = D.dry.multiplier, value_parser = parse_non_negative,
          allow_negative_numbers = true, help_heading = "Sampling")]
    pub dry_multiplier: f32,
    /// DRY: how fast the penalty grows with each token a repeat is longer, >= 1.
    #[arg(long, value_name = "X", default_value_t = D.dry.base, value_parser = parse_dry_base,
          allow_negative_numbers = true, help_heading = "Sampling")]
    pub dry_base: f32,
    /// DRY: the longest repeat (in tokens) that is not penalized.
    #[arg(long, value_name = "N", default_value_t = D.dry.allowed_length, value_parser = parse_count,
          allow_negative_numbers = true, help_heading = "Sampling")]
    pub dry_allowed_length: usize,
    /// DRY: how many recent tokens are searched for repeats; -1 = the whole context, 0 = off.
    #[arg(long, value_name = "N", default_value_t = D.dry.penalty_last_n, value_parser = parse_last_n,
          allow_negative_numbers = true, help_heading = "Sampling")]
    pub dry_penalty_last_n: i64,
    /// DRY: a string that ends a repeat (a token containing it is never part of one); repeatable, replacing the
    /// defaults "\n", ":", "\"" and "*"; `none` for no breakers. Understands the --stop escapes.
    #[arg(long = "dry-sequence-breaker", value_name = "STR", value_parser = parse_breaker,
          allow_hyphen_values = true, help_heading = "Sampling")]
    pub dry_sequence_breakers: Vec<String>,
    /// XTC: the chance, per token, of excluding every token at least --xtc-threshold likely but the least likely of
    /// them, in [0, 1]; 0 = off. For creative text; 0.5 is a common setting.
    #[arg(long, value_name = "P", default_value_t = D.xtc.probability, value_parser = parse_unit,
          allow_negative_numbers = true, help_heading = "Sampling")]
    pub xtc_probability: f32,
    /// XTC: how likely a token must be to count as a top choice, in [0, 1]; above 0.5 XTC does nothing.
    #[arg(long, value_name = "P", default_value_t = D.xtc.threshold, value_parser = parse_unit,
          allow_negative_numbers = true, help_heading = "Sampling")]
    pub xtc_threshold: f32,
    /// Locally typical sampling: keep the tokens whose surprise is closest to the distribution's entropy, as many
    /// as make up probability P, in (0, 1]; 1 = off. 0.9–0.95 are common settings.
    #[arg(long = "typical", value_name = "P", default_value_t = D.typical_p, value_parser = parse_mass,
          allow_negative_numbers = true, help_heading = "Sampling")]
    pub typical_p: f32,
    /// Dynamic temperature: the temperature moves up to X either way from --temp, up where the model is unsure
    /// and down where it is sure (by the entropy of the candidates); 0 = off.
    #[arg(long, value_name = "X", default_value_t = D.dynatemp.range, value_parser = parse_non_negative,
          allow_negative_numbers = true, help_heading = "Sampling")]
    pub dynatemp_range: f32,
    /// Dynamic temperature: how the temperature follows the entropy, > 0 (1 = in proportion).
    #[arg(long = "dynatemp-exp", value_name = "X", default_value_t = D.dynatemp.exponent,
          value_parser = parse_positive_float, allow_negative_numbers = true, help_heading = "Sampling")]
    pub dynatemp_exponent: f32,
    /// Mirostat 1 or 2: steer the surprise per token to --mirostat-ent instead of cutting with top-k, top-p and
    /// the others (which are then skipped); 0 = off.
    #[arg(long, value_name = "N", default_value_t = D.mirostat.version, value_parser = parse_mirostat,
          allow_negative_numbers = true, help_heading = "Sampling")]
    pub mirostat: u8,
    /// Mirostat's target surprise per token, in bits, >= 0 (tau).
    #[arg(long = "mirostat-ent", value_name = "BITS", default_value_t = D.mirostat.tau,
          value_parser = parse_non_negative, allow_negative_numbers = true, help_heading = "Sampling")]
    pub mirostat_tau: f32,
    /// Mirostat's learning rate, >= 0 (eta).
    #[arg(long = "mirostat-lr", value_name = "X", default_value_t = D.mirostat.eta,
          value_parser = parse_non_negative, allow_negative_numbers = true, help_heading = "Sampling")]
    pub mirostat_eta: f32,
    /// Seed of the random number generator, for reproducible output [default: random, from the clock].
    #[arg(long, value_name = "N", value_parser = parse_seed, allow_negative_numbers = true, help_heading = "Sampling")]
    pub seed: Option<u64>,
    /// The sampling steps to run, in order, separated by `;` (llama.cpp's names): the default is
    /// "penalties;dry;top_n_sigma;top_k;typ_p;top_p;min_p;xtc;temperature". A step left out does not run; the
    /// temperature rescales the logits where it stands, so the filters after it see the rescaled distribution.
    #[arg(long, value_name = "LIST", value_parser = SamplerOrder::parse, help_heading = "Sampling")]
    pub samplers: Option<SamplerOrder>,
    /// As `--samplers`, one letter per step (llama.cpp's `--sampling-seq`; the default is `edskypmxt`).
    #[arg(long, value_name = "LETTERS", value_parser = SamplerOrder::parse_letters, conflicts_with = "samplers",
          help_heading = "Sampling")]
    pub sampling_seq: Option<SamplerOrder>,
}

impl SamplingArgs {
    /// The parameters these flags ask for. Without `--seed` a fresh random seed is picked on every call: call this
    /// once per request and report the returned `seed`, so the user can reproduce the run.
    pub fn to_params(&self) -> SamplingParams {
        SamplingParams {
            temperature: self.temperature,
            top_k: self.top_k,
            top_p: self.top_p,
            min_p: self.min_p,
            top_n_sigma: self.top_n_sigma,
            repeat_penalty: self.repeat_penalty,
            repeat_last_n: self.repeat_last_n,
            presence_penalty: self.presence_penalty,
            frequency_penalty: self.frequency_penalty,
            dry: self.dry(),
            xtc: XtcParams { probability: self.xtc_probability, threshold: self.xtc_threshold },
            typical_p: self.typical_p,
            dynatemp: DynatempParams { range: self.dynatemp_range, exponent: self.dynatemp_exponent },
            mirostat: MirostatParams { version: self.mirostat, tau: self.mirostat_tau, eta: self.mirostat_eta },
            seed: self.seed.unwrap_or_else(random_seed),
            samplers: self.sampling_seq.or(self.samplers).unwrap_or_default(),
        }
    }

    pub fn dry(&self) -> DryParams {
        DryParams {
            multiplier: self.dry_multiplier,
            base: self.dry_base,
            allowed_length: self.dry_allowed_length,
            penalty_last_n: self.dry_penalty_last_n,
        }
    }

    /// The `--dry-sequence-breaker` strings: `None` for DRY's defaults, `Some(empty)` after `none`.
    pub fn dry_breakers(&self) -> Result<Option<Vec<String>>, String> {
        match self.dry_sequence_breakers.as_slice() {
            [] => Ok(None),
            all if all.iter().any(|b| b == NO_BREAKERS) => {
                if all.len() > 1 {
                    return Err(format!("--dry-sequence-breaker {NO_BREAKERS} cannot be combined with other breakers"));
                }
                Ok(Some(Vec::new()))
            }
            all => {
                crate::sampling::dry::check_breakers(all).map_err(|e| format!("--dry-sequence-breaker: {e}"))?;
                Ok(Some(all.to_vec()))
            }
        }
    }

    /// The `--logit-bias` flags (each checked when parsed; a token given twice keeps its last bias).
    pub fn logit_bias(&self) -> LogitBias {
        LogitBias::new(self.logit_bias.iter().copied()).expect("checked by parse_logit_bias")
    }
}

impl Default for SamplingArgs {
    fn default() -> Self {
        SamplingArgs {
            temperature: D.temperature,
            top_k: D.top_k,
            top_p: D.top_p,
            min_p: D.min_p,
            top_n_sigma: D.top_n_sigma,
            repeat_penalty: D.repeat_penalty,
            repeat_last_n: D.repeat_last_n,
            presence_penalty: D.presence_penalty,
            frequency_penalty: D.frequency_penalty,
            logit_bias: Vec::new(),
            dry_multiplier: D.dry.multiplier,
            dry_base: D.dry.base,
            dry_allowed_length: D.dry.allowed_length,
            dry_penalty_last_n: D.dry.penalty_last_n,
            dry_sequence_breakers: Vec::new(),
            xtc_probability: D.xtc.probability,
            xtc_threshold: D.xtc.threshold,
            typical_p: D.typical_p,
            dynatemp_range: D.dynatemp.range,
            dynatemp_exponent: D.dynatemp.exponent,
            mirostat: D.mirostat.version,
            mirostat_tau: D.mirostat.tau,
            mirostat_eta: D.mirostat.eta,
            seed: None,
            samplers: None,
            sampling_seq: None,
        }
    }
}

// When to stop generating. (Plain comment: see `SamplingArgs`.)
#[derive(Args, Debug, Clone, Default, PartialEq, Eq)]
pub struct StopArgs {
    /// Stop when the output contains STR (not printed); repeatable. Understands the escapes \n, \t, \r, \\,
    /// \xHH and \u{HEX}.
    #[arg(long = "stop", value_name = "STR", value_parser = parse_stop, allow_hyphen_values = true,
          help_heading = "Sampling")]
    pub stop: Vec<String>,
}

impl StopArgs {
    /// A matcher for these stop strings (one per request).
    pub fn matcher(&self) -> Result<StopMatcher, StopError> {
        StopMatcher::new(self.stop.iter().cloned())
    }
}

// How long the context and the output may be. (Plain comment: see `SamplingArgs`.)
#[derive(Args, Debug, Clone, PartialEq, Eq)]
pub struct LengthArgs {
    /// Most tokens to generate (per reply, in chat); -1 = until an end token or a full context.
    #[arg(short = 'n', long = "n-predict", value_name = "N", default_value_t = -1, allow_negative_numbers = true,
          value_parser = parse_n_predict)]
    pub n_predict: i64,
    /// Context size in tokens; 0 = the model's trained context.
    #[arg(short = 'c', long = "ctx-size", value_name = "N", default_value_t = 4096)]
    pub ctx_size: usize,
}

impl LengthArgs {
    /// `-n` as a limit: `None` for -1.
    pub fn max_tokens(&self) -> Option<usize> {
        usize::try_from(self.n_predict).ok()
    }

    /// The context size, given the model's trained context for `-c 0`.
    pub fn n_ctx(&self, n_ctx_train: usize) -> usize {
        if self.ctx_size == 0 { n_ctx_train } else { self.ctx_size }
    }
}

/// `-n`: -1 (unlimited) or a count ≥ 0.
pub fn parse_n_predict(s: &str) -> Result<i64, String> {
    let n: i64 = s.trim().parse().map_err(|_| format!("'{s}' is not a whole number"))?;
    if n < -1 { Err("must be -1 (unlimited) or a count ≥ 0".into()) } else { Ok(n) }
}

// Speculative decoding. (Plain comment: see `SamplingArgs`.)
#[derive(Args, Debug, Clone, PartialEq, Eq)]
pub struct DraftArgs {
    /// Guess the next tokens and check them in the pass that decodes the current one: `ngram` proposes what
    /// followed the last few tokens where they occurred earlier in the prompt or the reply (prompt lookup). The
    /// text is the same as without it, at any temperature; it comes faster when the reply repeats its input
    /// (quoting, summaries, code edits), and guesses are fed only while they pay. `none` = off.
    #[arg(
        long = "spec-type",
        value_enum,
        value_name = "TYPE",
        default_value = "ngram",
        help_heading = "Speculative decoding"
    )]
    pub spec_type: SpecType,
    /// Most guessed tokens per pass, 1 to 32.
    #[arg(long = "draft-max", value_name = "N", default_value_t = 16, value_parser = parse_draft_len, allow_negative_numbers = true,
          help_heading = "Speculative decoding")]
    pub draft_max: usize,
    /// Fewest guessed tokens worth a pass, 1 to 32: a shorter guess is not tried.
    #[arg(long = "draft-min", value_name = "N", default_value_t = 1, value_parser = parse_draft_len, allow_negative_numbers = true,
          help_heading = "Speculative decoding")]
    pub draft_min: usize,
    /// Longest run of recent tokens looked up in the text, 2 to 16 (shorter runs down to 2 are tried next).
    #[arg(long = "spec-ngram-size", value_name = "N", default_value_t = 3, value_parser = parse_ngram_size, allow_negative_numbers = true,
          help_heading = "Speculative decoding")]
    pub ngram: usize,
    /// Feed every guess, even where guessing has been slower than plain decoding (by default the guesses fed are
    /// the number expected to pay, from measured times and acceptance rates): to measure what guessing costs.
    #[arg(long = "draft-always", help_heading = "Speculative decoding")]
    pub always: bool,
}

/// `--spec-type`'s choices.
#[derive(ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum SpecType {
    None,
    Ngram,
}

impl DraftArgs {
    pub fn params(&self) -> DraftParams {
        match self.spec_type {
            SpecType::None => DraftParams::OFF,
            SpecType::Ngram => DraftParams {
                max: self.draft_max,
                min: self.draft_min.min(self.draft_max),
                ngram: self.ngram,
                always: self.always,
            },
        }
    }
}

/// A count in `lo..=hi`.
fn parse_bounded(text: &str, lo: usize, hi: usize) -> Result<usize, String> {
    let range = || format!("must be a whole number from {lo} to {hi}");
    let n = parse_count(text).map_err(|_| range())?;
    if (lo..=hi).contains(&n) { Ok(n) } else { Err(range()) }
}

fn parse_draft_len(s: &str) -> Result<usize, String> {
    parse_bounded(s, 1, MAX_DRAFT)
}

fn parse_ngram_size(s: &str) -> Result<usize, String> {
    parse_bounded(s, crate::speculative::MIN_NGRAM, 16)
}

// How many CPU threads the engine uses. (Plain comment: see `SamplingArgs`.)
#[derive(Args, Debug, Clone, Default, PartialEq, Eq)]
pub struct ThreadArgs {
    /// Number of threads, at least 1 [default: one per physical core this process may use; performance cores
    /// only on a hybrid CPU; see `infer info`].
    #[arg(short = 't', long, value_name = "N", value_parser = parse_threads, allow_negative_numbers = true)]
    pub threads: Option<NonZeroUsize>,
}

impl ThreadArgs {
    /// The thread count: `--threads`, or one per usable physical core ([`crate::cpu_topology::default_threads`]).
    /// Warns once on stderr when `--threads` asks for more threads than the CPUs this process may use: the
    /// kernels' helpers spin between regions, so extra threads take turns on a core instead of adding to it
    /// (SmolLM2 Q4_1 on 2 CPUs, `-t 4` against `-t 2`: tg32 -10%, pp128 -4%).
    pub fn count(&self) -> usize {
        match self.threads {
            Some(n) => {
                let usable = crate::cpu_topology::cpu_quota();
                static WARNED: std::sync::Once = std::sync::Once::new();
                if n.get() > usable {
                    WARNED.call_once(|| {
                        crate::cli::output::eprintln_lossy!(
                            "warning: {n} threads on {usable} usable CPUs: the extra threads take turns with the \
                             others and slow them down; -t {usable} or fewer is faster"
                        )
                    });
                }
                n.get()
            }
            None => crate::cpu_topology::default_threads().threads,
        }
    }

    /// Why the thread count is what it is, for start-up lines: `-t`, or the default's reason.
    pub fn reason(&self) -> &'static str {
        match self.threads {
            Some(_) => "-t",
            None => crate::cpu_topology::default_threads().reason,
        }
    }

    /// A rayon pool with [`count`](Self::count) threads.
    pub fn build_pool(&self) -> Result<rayon::ThreadPool, rayon::ThreadPoolBuildError> {
        rayon::ThreadPoolBuilder::new().num_threads(self.count()).thread_name(|i| format!("infer-worker-{i}")).build()
    }

    /// Runs `f` inside a fresh pool of [`count`](Self::count) threads, so rayon work in it uses that many.
    /// Fails only if the operating system refuses to start the threads.
    pub fn install<R, F>(&self, f: F) -> Result<R, rayon::ThreadPoolBuildError>
    where
        F: FnOnce() -> R + Send,
        R: Send,
    {
        Ok(self.build_pool()?.install(f))
    }
}

/// A finite number (`--top-n-sigma`; the others' checks start here).
pub fn parse_float(text: &str) -> Result<f32, String> {
    let value: f32 = text.trim().parse().map_err(|_| format!("'{text}' is not a number"))?;
    if value.is_finite() { Ok(value) } else { Err(format!("'{text}' is not a finite number")) }
}

/// `--temp`: a finite number ≥ 0.
pub fn parse_temperature(text: &str) -> Result<f32, String> {
    let value = parse_float(text)?;
    if value >= 0.0 { Ok(value) } else { Err("the temperature must be >= 0 (0 = greedy)".into()) }
}

/// `--top-p`: a number in (0, 1].
pub fn parse_top_p(text: &str) -> Result<f32, String> {
    let value = parse_float(text)?;
    if value > 0.0 && value <= 1.0 { Ok(value) } else { Err("top-p must be in (0, 1] (1 = off)".into()) }
}

/// `--typical`: a number in (0, 1].
pub fn parse_mass(text: &str) -> Result<f32, String> {
    let value = parse_float(text)?;
    if value > 0.0 && value <= 1.0 { Ok(value) } else { Err("must be in (0, 1] (1 = off)".into()) }
}

/// `--dynatemp-exp`: a finite number > 0.
pub fn parse_positive_float(text: &str) -> Result<f32, String> {
    let value = parse_float(text)?;
    if value > 0.0 { Ok(value) } else { Err("must be > 0".into()) }
}

/// `--mirostat`: 0 (off), 1 or 2.
pub fn parse_mirostat(text: &str) -> Result<u8, String> {
    match text.trim() {
        "0" => Ok(0),
        "1" => Ok(1),
        "2" => Ok(2),
        _ => Err(format!("'{text}' is not a Mirostat version: 0 (off), 1 or 2")),
    }
}

/// `--min-p`: a number in [0, 1].
pub fn parse_min_p(text: &str) -> Result<f32, String> {
    let value = parse_float(text)?;
    if (0.0..=1.0).contains(&value) { Ok(value) } else { Err("min-p must be in [0, 1] (0 = off)".into()) }
}

/// `--xtc-probability`, `--xtc-threshold`: a number in [0, 1].
pub fn parse_unit(text: &str) -> Result<f32, String> {
    let value = parse_float(text)?;
    if (0.0..=1.0).contains(&value) { Ok(value) } else { Err("must be in [0, 1] (0 = off)".into()) }
}

/// `--dry-multiplier`, `--dynatemp-range`, `--mirostat-ent`, `--mirostat-lr`: a finite number >= 0.
pub fn parse_non_negative(text: &str) -> Result<f32, String> {
    let value = parse_float(text)?;
    if value >= 0.0 { Ok(value) } else { Err("must be >= 0".into()) }
}

/// `--dry-base`: a finite number >= 1.
pub fn parse_dry_base(text: &str) -> Result<f32, String> {
    let value = parse_float(text)?;
    if value >= 1.0 { Ok(value) } else { Err("must be >= 1 (1 = the same penalty at every length)".into()) }
}

/// `--dry-penalty-last-n`: a count, or -1 for everything.
pub fn parse_last_n(text: &str) -> Result<i64, String> {
    match text.trim().parse::<i64>() {
        Ok(n) if n >= -1 => Ok(n),
        _ => Err(format!("'{text}' is not a count >= 0 or -1 (the whole context)")),
    }
}

/// The `--dry-sequence-breaker` value that means "no breakers" (llama.cpp's spelling).
pub const NO_BREAKERS: &str = "none";

/// `--dry-sequence-breaker`: a string with the `--stop` escapes. Its emptiness, length and count are checked with
/// the others' by [`SamplingArgs::dry_breakers`] (`dry::check_breakers`, the API's check too), before any model loads.
pub fn parse_breaker(text: &str) -> Result<String, String> {
    crate::stop::unescape(text).map_err(|e| format!("sequence breaker '{text}': {e}"))
}

/// `--repeat-penalty`: a finite number > 0.
pub fn parse_repeat_penalty(text: &str) -> Result<f32, String> {
    let value = parse_float(text)?;
    if value > 0.0 { Ok(value) } else { Err("the repeat penalty must be > 0 (1 = off)".into()) }
}

/// `--presence-penalty`, `--frequency-penalty`: a number in [-2, 2] (OpenAI's range).
pub fn parse_penalty(text: &str) -> Result<f32, String> {
    let value = parse_float(text)?;
    let limit = crate::sampling::PENALTY_LIMIT;
    if (-limit..=limit).contains(&value) { Ok(value) } else { Err(format!("must be in [-{limit}, {limit}] (0 = off)")) }
}

/// `--logit-bias`: `ID+BIAS` or `ID-BIAS` (llama.cpp's form), the bias at most 100 either way, or `ID-inf` to ban.
pub fn parse_logit_bias(text: &str) -> Result<(u32, f32), String> {
    let text = text.trim();
    let split = text.find(['+', '-']).ok_or_else(|| format!("'{text}' is not ID+BIAS or ID-BIAS (e.g. 15043-1.5)"))?;
    let (id, bias) = text.split_at(split);
    let id: u32 = id.parse().map_err(|_| format!("'{id}' is not a token id (a whole number >= 0)"))?;
    let (sign, magnitude) = bias.split_at(1);
    let bias = match magnitude {
        "inf" if sign == "-" => f32::NEG_INFINITY,
        "inf" => return Err("+inf is not a bias: the most is +100 (-inf bans a token)".into()),
        m => {
            let v: f32 = m.parse().map_err(|_| format!("'{m}' is not a number"))?;
            if !(v.is_finite() && v <= BIAS_LIMIT) {
                return Err(format!("the bias must be at most {BIAS_LIMIT} either way (or -inf to ban), got {bias}"));
            }
            if sign == "-" { -v } else { v }
        }
    };
    Ok((id, bias))
}

/// `--top-k`, `--repeat-last-n`: a whole number ≥ 0.
pub fn parse_count(text: &str) -> Result<usize, String> {
    let text = text.trim();
    match text.parse::<usize>() {
        Ok(value) => Ok(value),
        Err(_) if text.starts_with('-') && text[1..].bytes().all(|b| b.is_ascii_digit()) && text.len() > 1 => {
            Err("must be >= 0 (0 = off)".into())
        }
        Err(_) => Err(format!("'{text}' is not a whole number >= 0")),
    }
}

/// `--seed`: a whole number in [0, 2^64).
pub fn parse_seed(text: &str) -> Result<u64, String> {
    text.trim().parse::<u64>().map_err(|_| {
        format!("'{text}' is not a seed: expected a whole number in [0, 2^64) (leave --seed out for a random one)")
    })
}

/// A count of at least 1.
pub fn parse_positive(text: &str) -> Result<usize, String> {
    match parse_count(text) {
        Ok(0) => Err("must be at least 1".into()),
        other => other,
    }
}

/// `--threads`: a whole number ≥ 1.
pub fn parse_threads(text: &str) -> Result<NonZeroUsize, String> {
    let count =
        parse_count(text).map_err(|_| format!("'{text}' is not a thread count: expected a whole number >= 1"))?;
    NonZeroUsize::new(count).ok_or_else(|| "the thread count must be at least 1".to_string())
}

// The shape of the output (structured output).
#[derive(Args, Debug, Clone, PartialEq)]
pub struct FormatArgs {
    /// The shape of the output: `json` constrains generation to one JSON object (valid by construction, checked
    /// token by token) and stops when it closes.
    #[arg(long, value_enum, value_name = "FORMAT", default_value_t = FormatArg::Text, help_heading = "Sampling")]
    pub format: FormatArg,
    /// Constrain the output to one JSON value of this JSON schema (given as JSON text), and stop when it closes;
    /// e.g. '{"type":"object","properties":{"name":{"type":"string"}},"required":["name"]}'. Implies
    /// `--format json`.
    #[arg(short = 'j', long, value_name = "SCHEMA", value_parser = parse_json_schema, help_heading = "Sampling")]
    pub json_schema: Option<Arc<JsonSchema>>,
    /// As `--json-schema`, with the schema read from a file.
    #[arg(
        long,
        value_name = "FILE",
        value_parser = parse_json_schema_file,
        conflicts_with = "json_schema",
        help_heading = "Sampling"
    )]
    pub json_schema_file: Option<Arc<JsonSchema>>,
    /// Constrain the output to text of this GBNF grammar (llama.cpp's format), matched from its rule `root`; e.g.
    /// 'root ::= ("yes" | "no") "."'. The model may end where the text is a whole match, and must end where
    /// nothing can follow.
    #[arg(
        long,
        value_name = "GBNF",
        value_parser = parse_grammar,
        conflicts_with_all = ["json_schema", "json_schema_file", "format"],
        help_heading = "Sampling"
    )]
    pub grammar: Option<Arc<Grammar>>,
    /// As `--grammar`, with the grammar read from a file (e.g. llama.cpp's `grammars/*.gbnf`).
    #[arg(
        long,
        value_name = "FILE",
        value_parser = parse_grammar_file,
        conflicts_with_all = ["grammar", "json_schema", "json_schema_file", "format"],
        help_heading = "Sampling"
    )]
    pub grammar_file: Option<Arc<Grammar>>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum FormatArg {
    /// Free text.
    Text,
    /// One JSON object.
    Json,
}

impl FormatArgs {
    pub fn output_format(&self) -> OutputFormat {
        if let Some(grammar) = self.grammar.as_ref().or(self.grammar_file.as_ref()) {
            return OutputFormat::Grammar(grammar.clone());
        }
        if let Some(schema) = self.json_schema.as_ref().or(self.json_schema_file.as_ref()) {
            return OutputFormat::JsonSchema(schema.clone());
        }
        match self.format {
            FormatArg::Text => OutputFormat::Text,
            FormatArg::Json => OutputFormat::JsonObject,
        }
    }
}

/// `--json-schema`: JSON text of a schema the structured output supports (compiled here, before the model loads).
pub fn parse_json_schema(text: &str) -> Result<Arc<JsonSchema>, String> {
    let value: serde_json::Value = serde_json::from_str(text).map_err(|e| format!("not JSON: {e}"))?;
    JsonSchema::compile(&value).map(Arc::new).map_err(|e| e.to_string())
}

/// `--json-schema-file`: as [`parse_json_schema`], from a file (the input size cap of prompt files applies).
pub fn parse_json_schema_file(path: &str) -> Result<Arc<JsonSchema>, String> {
    let text = crate::cli::input::read_text_file(std::path::Path::new(path)).map_err(|e| format!("{e:#}"))?;
    parse_json_schema(&text).map_err(|e| format!("{path}: {e}"))
}

/// `--grammar`: GBNF text (compiled here, before the model loads).
pub fn parse_grammar(text: &str) -> Result<Arc<Grammar>, String> {
    Grammar::parse(text).map(Arc::new).map_err(|e| format!("grammar: {e}"))
}

/// `--grammar-file`: as [`parse_grammar`], from a file (the input size cap of prompt files applies).
pub fn parse_grammar_file(path: &str) -> Result<Arc<Grammar>, String> {
    let text = crate::cli::input::read_text_file(std::path::Path::new(path)).map_err(|e| format!("{e:#}"))?;
    Grammar::parse(&text).map(Arc::new).map_err(|e| format!("{path}: {e}"))
}
