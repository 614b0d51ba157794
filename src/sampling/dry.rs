//! DRY ("don't repeat yourself"): a penalty on the token that would carry on a repeat of text already in the
//! history, growing exponentially with the length of the repeat. The sampler was proposed by p-e-w for
//! text-generation-webui (PR #5677, 2024) and llama.cpp (`--dry-*`) and koboldcpp offer it; this is our own
//! implementation of the published definition.
//!
//! # The definition
//!
//! The window is the last `penalty_last_n` tokens of the history (all of it for −1). For every earlier position `i`
//! of the window, the *match* at `i` is the largest `n` such that the `n` tokens before `i` equal the last `n`
//! tokens of the window: generating the token at `i` now would make the repeat `n + 1` tokens long. When
//! `n ≥ allowed_length`, that token loses `multiplier × base^(n − allowed_length)` from its logit; a token that
//! follows several matches pays for the longest.
//!
//! A *sequence breaker* ends a match: a token whose text contains one of the breaker strings (by default newline,
//! colon, double quote and asterisk) cannot be part of one. So formatting that recurs by design (list markers,
//! `Name:` lines, quoted speech) is not penalized, while a sentence or a paragraph coming round again is. A breaker
//! string that a tokenizer splits over two tokens is not seen (llama.cpp looks for those too).
//!
//! Unlike the repeat penalty, DRY leaves single repeated words alone (matches shorter than `allowed_length` cost
//! nothing) and stops the loops that small models fall into (FEATURES.md §2.14: llama.cpp #10312, candle #2068)
//! without pushing the model off the vocabulary that the topic needs.
//!
//! # Cost
//!
//! Both suffixes of a match end at the same distance from a breaker, so every match is capped by the length of the
//! window's breaker-free tail, and all matches come from one Z-function over the reversed window: O(window) per
//! sampled token, with the scratch space kept in the sampler.

use std::sync::{Arc, OnceLock};

use serde::{Deserialize, Serialize};

use super::SamplingError;
use crate::tokenizer::Tokenizer;

/// DRY's knobs. See the [module docs](self).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct DryParams {
    /// The penalty of a repeat of exactly `allowed_length` tokens, ≥ 0; 0 = off. 0.8 is the usual setting.
    pub multiplier: f32,
    /// How fast the penalty grows with each token the repeat is longer, ≥ 1.
    pub base: f32,
    /// The longest repeat that costs nothing.
    pub allowed_length: usize,
    /// How many of the most recent tokens are searched for repeats; −1 = the whole history, 0 = off.
    pub penalty_last_n: i64,
}

impl DryParams {
    /// Off, with the usual settings (llama.cpp's and koboldcpp's defaults) for when a multiplier is given.
    pub const OFF: DryParams = DryParams { multiplier: 0.0, base: 1.75, allowed_length: 2, penalty_last_n: -1 };

    /// Whether DRY would change the logits (given a history).
    pub fn is_on(&self) -> bool {
        self.multiplier > 0.0 && self.penalty_last_n != 0
    }

    pub(super) fn validate(&self) -> Result<(), SamplingError> {
        let bad = |name, value, expected| Err(SamplingError::InvalidParam { name, value, expected });
        if !(self.multiplier.is_finite() && self.multiplier >= 0.0) {
            return bad("dry_multiplier", self.multiplier, "a number >= 0 (0 = off)");
        }
        if !(self.base.is_finite() && self.base >= 1.0) {
            return bad("dry_base", self.base, "a number >= 1");
        }
        if self.penalty_last_n < -1 {
            return bad("dry_penalty_last_n", self.penalty_last_n as f32, "a count >= 0, or -1 for the whole history");
        }
        Ok(())
    }
}

impl Default for DryParams {
    fn default() -> Self {
        DryParams::OFF
    }
}

/// The breaker strings used when a request names none (llama.cpp's and koboldcpp's defaults).
pub const DEFAULT_BREAKERS: [&str; 4] = ["\n", ":", "\"", "*"];

/// Most breaker strings a request may name, and their longest length in bytes: each costs a scan of the
/// vocabulary when the request starts.
pub const MAX_BREAKERS: usize = 32;
pub const MAX_BREAKER_LEN: usize = 64;

/// Why a list of breaker strings was refused.
pub fn check_breakers(breakers: &[String]) -> Result<(), String> {
    if breakers.len() > MAX_BREAKERS {
        return Err(format!("{} sequence breakers: at most {MAX_BREAKERS}", breakers.len()));
    }
    for b in breakers {
        if b.is_empty() {
            return Err("a sequence breaker is empty (it would break every token)".into());
        }
        if b.len() > MAX_BREAKER_LEN {
            return Err(format!("a sequence breaker of {} bytes: at most {MAX_BREAKER_LEN}", b.len()));
        }
    }
    Ok(())
}

/// The ids of the tokens whose text contains one of `breakers`, sorted. Control tokens (whose text is not output)
/// never break; empty strings are skipped.
pub fn breaker_tokens<S: AsRef<str>>(tokenizer: &Tokenizer, breakers: &[S]) -> Vec<u32> {
    let needles: Vec<&[u8]> = breakers.iter().map(|b| b.as_ref().as_bytes()).filter(|b| !b.is_empty()).collect();
    (0..tokenizer.n_vocab() as u32)
        .filter(|&id| {
            let text = tokenizer.token_bytes(id, true);
            needles.iter().any(|n| text.windows(n.len()).any(|w| w == *n))
        })
        .collect()
}

/// The breaker tokens for a request: its own strings, or (`None`) the defaults, resolved once per tokenizer into
/// `standard`.
pub fn resolve_breakers(tokenizer: &Tokenizer, own: Option<&[String]>, standard: &OnceLock<Arc<[u32]>>) -> Arc<[u32]> {
    match own {
        Some(strings) => breaker_tokens(tokenizer, strings).into(),
        None => standard.get_or_init(|| breaker_tokens(tokenizer, &DEFAULT_BREAKERS).into()).clone(),
    }
}

/// Reused buffers of [`apply`].
#[derive(Debug, Clone, Default)]
pub(super) struct DryScratch {
    reversed: Vec<u32>,
    z: Vec<u32>,
    /// (token, length of the longest match it would extend).
    hits: Vec<(u32, u32)>,
}

/// Subtracts DRY's penalties from `scores` (one per vocabulary entry). `breakers` is sorted.
pub(super) fn apply(
    history: &[u32],
    params: &DryParams,
    breakers: &[u32],
    scores: &mut [f32],
    scratch: &mut DryScratch,
) -> Result<(), SamplingError> {
    let window = match usize::try_from(params.penalty_last_n) {
        Ok(n) => &history[history.len().saturating_sub(n)..],
        Err(_) => history,
    };
    let is_breaker = |t: &u32| breakers.binary_search(t).is_ok();
    // No match reaches past the last breaker: both of its copies would contain it.
    let tail = window.iter().rev().take_while(|t| !is_breaker(t)).count();
    let shortest = params.allowed_length.max(1);
    if tail < shortest {
        return Ok(());
    }
    let DryScratch { reversed, z, hits } = scratch;
    reversed.clear();
    reversed.extend(window.iter().rev());
    z_function(reversed, z);
    // Reversed, the suffix that ends just before position i starts at j = len − i, and z[j] is how far it agrees
    // with the window's own suffix.
    let len = window.len();
    hits.clear();
    for i in 1..len {
        let n = (z[len - i] as usize).min(tail);
        if n >= shortest {
            hits.push((window[i], n as u32));
        }
    }
    hits.sort_unstable();
    // Sorted by token then length: the last of each token's run is its longest match.
    for run in hits.chunk_by(|a, b| a.0 == b.0) {
        let (token, n) = run[run.len() - 1];
        let Some(v) = scores.get_mut(token as usize) else {
            return Err(SamplingError::TokenOutOfRange { token, vocab_size: scores.len() });
        };
        // n ≥ shortest ≥ allowed_length.
        let penalty = params.multiplier * params.base.powf((n as usize - params.allowed_length) as f32);
        // A long repeat makes the penalty overflow: saturate rather than poison the rest with infinities.
        *v = (*v - penalty).clamp(f32::MIN, f32::MAX);
    }
    Ok(())
}

/// `z[k]` = the length of the longest common prefix of `s` and `s[k..]` (`z[0]` = `s.len()`), in O(len): the
/// classic Z-function, which reuses the rightmost stretch already known to match a prefix.
fn z_function(s: &[u32], z: &mut Vec<u32>) {
    let n = s.len();
    z.clear();
    z.resize(n, 0);
    if n == 0 {
        return;
    }
    z[0] = n as u32;
    // s[left..right] is the match ending furthest to the right found so far: it equals s[..right - left].
    let (mut left, mut right) = (0, 0);
    for k in 1..n {
        let mut m = if k < right { (z[k - left] as usize).min(right - k) } else { 0 };
        while k + m < n && s[m] == s[k + m] {
            m += 1;
        }
        z[k] = m as u32;
        if k + m > right {
            (left, right) = (k, k + m);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Matches by their definition, in O(len²) per position.
    fn penalties_by_definition(window: &[u32], params: &DryParams, breakers: &[u32], vocab: usize) -> Vec<f32> {
        let mut out = vec![0.0f32; vocab];
        let len = window.len();
        for i in 1..len {
            let mut n = 0;
            while n < i && window[i - 1 - n] == window[len - 1 - n] && !breakers.contains(&window[len - 1 - n]) {
                n += 1;
            }
            if n >= params.allowed_length.max(1) {
                let p = params.multiplier * params.base.powf((n - params.allowed_length) as f32);
                let t = window[i] as usize;
                out[t] = out[t].max(p);
            }
        }
        out
    }

    #[test]
    fn z_function_matches_its_definition() {
        let s = [1u32, 2, 1, 2, 1, 3, 1, 2, 1, 2];
        let mut z = Vec::new();
        z_function(&s, &mut z);
        for k in 0..s.len() {
            let lcp = s.iter().zip(&s[k..]).take_while(|(a, b)| a == b).count();
            assert_eq!(z[k] as usize, lcp, "k = {k}");
        }
    }

    #[test]
    fn penalties_match_the_definition_on_random_histories() {
        let mut state = 12345u64;
        let mut next = |m: u64| {
            state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            (state >> 33) % m
        };
        let mut scratch = DryScratch::default();
        for round in 0..500 {
            let vocab = 2 + next(6) as usize;
            let len = next(60) as usize;
            let history: Vec<u32> = (0..len).map(|_| next(vocab as u64) as u32).collect();
            let breakers: Vec<u32> = if round % 3 == 0 { vec![0] } else { Vec::new() };
            let params = DryParams {
                multiplier: 0.8,
                base: 1.75,
                allowed_length: next(4) as usize,
                penalty_last_n: [-1, 0, 5, 20][round % 4],
            };
            let window = match usize::try_from(params.penalty_last_n) {
                Ok(n) => &history[len.saturating_sub(n)..],
                Err(_) => &history[..],
            };
            let mut scores = vec![0.0f32; vocab];
            if params.is_on() {
                apply(&history, &params, &breakers, &mut scores, &mut scratch).unwrap();
            }
            let want: Vec<f32> = if params.is_on() {
                penalties_by_definition(window, &params, &breakers, vocab).iter().map(|p| -p).collect()
            } else {
                vec![0.0; vocab]
            };
            for (t, (got, want)) in scores.iter().zip(&want).enumerate() {
                assert!((got - want).abs() <= 1e-5 * want.abs().max(1.0), "{history:?} {params:?} token {t}");
            }
        }
    }

    #[test]
    fn a_repeated_sentence_is_penalized_and_a_breaker_stops_it() {
        // "1 2 3 4 1 2 3": 4 would carry on a 3-token repeat.
        let history = [1u32, 2, 3, 4, 1, 2, 3];
        let params = DryParams { multiplier: 1.0, base: 2.0, allowed_length: 2, penalty_last_n: -1 };
        let mut scores = vec![0.0f32; 8];
        apply(&history, &params, &[], &mut scores, &mut DryScratch::default()).unwrap();
        assert_eq!(scores, [0.0, 0.0, 0.0, 0.0, -2.0, 0.0, 0.0, 0.0]);
        // With 2 a breaker, the repeat is "3" alone: shorter than allowed.
        let mut scores = vec![0.0f32; 8];
        apply(&history, &params, &[2], &mut scores, &mut DryScratch::default()).unwrap();
        assert_eq!(scores, [0.0; 8]);
        // An id beyond the scores is an error, not a panic.
        let mut short = vec![0.0f32; 4];
        assert!(matches!(
            apply(&history, &params, &[], &mut short, &mut DryScratch::default()),
            Err(SamplingError::TokenOutOfRange { token: 4, .. })
        ));
    }

    #[test]
    fn a_long_loop_saturates_instead_of_overflowing() {
        let history: Vec<u32> = (0..3000).map(|i| i % 3).collect();
        let params = DryParams { multiplier: 5.0, base: 4.0, allowed_length: 2, penalty_last_n: -1 };
        let mut scores = vec![10.0f32; 3];
        apply(&history, &params, &[], &mut scores, &mut DryScratch::default()).unwrap();
        assert_eq!(scores[0], f32::MIN);
        assert!(scores.iter().all(|v| v.is_finite()));
    }
}
