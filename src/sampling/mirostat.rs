//! Mirostat (Basu et al., "Mirostat: A Neural Text Decoding Algorithm that Directly Controls Perplexity", ICLR
//! 2021; llama.cpp's `--mirostat 1|2`, ollama's and llama-server's `mirostat`, `mirostat_tau`, `mirostat_eta`); our
//! own implementation of the paper's two algorithms.
//!
//! Instead of a fixed cut, Mirostat steers the surprise (`−log₂ p` of each drawn token) towards a target `tau`: a
//! feedback loop keeps a bound `mu` (starting at `2·tau`) and, after each draw, moves it by `eta` times the error
//! `surprise − tau`. Too much surprise tightens the cut, too little loosens it, so text stays neither repetitive
//! (surprise too low, the "boredom trap") nor incoherent (too high).
//! - **Version 2** keeps the tokens whose surprise is at most `mu`.
//! - **Version 1** estimates the Zipf exponent `s` of the distribution from its top 100 tokens and keeps the `k`
//!   most likely, with `k` chosen so that the expected surprise is `mu` under that Zipf law.
//!
//! Mirostat replaces the filters: with it on, top-nσ, top-k, typical, top-p, min-p, XTC and dynamic temperature are
//! skipped (llama.cpp does the same). The logit bias, the penalties, DRY, a structured-output mask and the
//! temperature still apply; the surprise is measured on the distribution the token was drawn from.

use serde::{Deserialize, Serialize};

use super::{Cand, SamplingError, by_logit_desc, exp_nonpos, top_k_scan};

/// How many of the most likely tokens version 1 fits its Zipf exponent to (the paper's m).
const ZIPF_TOKENS: usize = 100;

/// Mirostat's knobs. See the [module docs](self).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct MirostatParams {
    /// 0 = off, 1 or 2: which algorithm.
    pub version: u8,
    /// The target surprise per token, in bits, ≥ 0 (llama.cpp's `--mirostat-ent`).
    pub tau: f32,
    /// How fast `mu` follows the error, ≥ 0 (llama.cpp's `--mirostat-lr`).
    pub eta: f32,
}

impl MirostatParams {
    /// Off, with llama.cpp's defaults for when a version is given.
    pub const OFF: MirostatParams = MirostatParams { version: 0, tau: 5.0, eta: 0.1 };

    pub fn is_on(&self) -> bool {
        self.version != 0
    }

    /// The bound a fresh sequence starts from.
    pub fn initial_mu(&self) -> f32 {
        2.0 * self.tau
    }

    pub(super) fn validate(&self) -> Result<(), SamplingError> {
        if self.version > 2 {
            let value = f32::from(self.version);
            return Err(SamplingError::InvalidParam { name: "mirostat", value, expected: "0 (off), 1 or 2" });
        }
        for (name, value) in [("mirostat_tau", self.tau), ("mirostat_eta", self.eta)] {
            if !(value.is_finite() && value >= 0.0) {
                return Err(SamplingError::InvalidParam { name, value, expected: "a number >= 0" });
            }
        }
        Ok(())
    }

    /// The `mu` after drawing a token with probability `prob` (in the distribution it was drawn from).
    pub(super) fn update(&self, mu: f32, prob: f64) -> f32 {
        let surprise = -prob.log2();
        let next = f64::from(mu) - f64::from(self.eta) * (surprise - f64::from(self.tau));
        // A surprise is finite (a drawn token has weight) and mu moves by at most eta × ~150 bits a step; the clamp
        // only keeps a huge eta from running away to infinity over a long generation.
        next.clamp(-1e6, 1e6) as f32
    }
}

impl Default for MirostatParams {
    fn default() -> Self {
        MirostatParams::OFF
    }
}

/// Leaves in `cands` the tokens Mirostat may draw from `scores` (largest `max`, first reached at index `best`, at
/// temperature `t` > 0) for the bound `mu`: at least the most likely token.
pub(super) fn candidates(
    p: &MirostatParams,
    scores: &[f32],
    (max, best): (f32, u32),
    t: f32,
    mu: f32,
    cands: &mut Vec<Cand>,
) {
    cands.clear();
    if p.version == 1 {
        let n = scores.len();
        top_k_scan(scores, ZIPF_TOKENS.min(n), cands);
        cands.sort_unstable_by(by_logit_desc);
        let k = zipf_k(cands, t, mu, n);
        if k > cands.len() {
            top_k_scan(scores, k, cands);
            cands.sort_unstable_by(by_logit_desc);
        }
        cands.truncate(k);
    } else {
        // Surprise ≤ mu ⇔ (s − max)/t − ln z ≥ −mu·ln 2, with z = Σ exp((s − max)/t).
        let z: f64 = scores.iter().map(|&s| f64::from(exp_nonpos((s - max) / t))).sum();
        let floor = f64::from(max) + f64::from(t) * (z.ln() - f64::from(mu) * std::f64::consts::LN_2);
        cands.extend(
            scores
                .iter()
                .enumerate()
                .filter(|&(_, &s)| f64::from(s) >= floor)
                .map(|(i, &s)| Cand { id: i as u32, logit: s }),
        );
        if cands.is_empty() {
            // Even the best token is more surprising than mu allows: it alone is kept.
            cands.push(Cand { id: best, logit: max });
        }
    }
}

/// Version 1's `k` for the sorted top tokens `top` of a vocabulary of `n`, at temperature `t` and bound `mu`: the
/// Zipf exponent `s` is fitted by least squares to the log-ratios of neighbouring probabilities, and `k` makes a
/// Zipf law of that exponent over `n` tokens surprise by `mu` bits.
fn zipf_k(top: &[Cand], t: f32, mu: f32, n: usize) -> usize {
    let (mut num, mut den) = (0.0f64, 0.0f64);
    for (i, pair) in top.windows(2).enumerate() {
        let ti = ((i + 2) as f64 / (i + 1) as f64).ln();
        let bi = f64::from(pair[0].logit - pair[1].logit) / f64::from(t);
        num += ti * bi;
        den += ti * ti;
    }
    if den == 0.0 || num <= 0.0 {
        // One token, or a flat top: no Zipf slope to fit, and nothing to cut.
        return n;
    }
    let s = num / den;
    let eps = s - 1.0;
    let n_f = n as f64;
    // eps / (1 − n^−eps), which tends to 1 / ln n as eps → 0.
    let ratio = if eps.abs() < 1e-9 { 1.0 / n_f.ln() } else { eps / (1.0 - n_f.powf(-eps)) };
    let k = (ratio * f64::from(mu).exp2()).powf(1.0 / s);
    if k.is_finite() { (k.round() as usize).clamp(1, n) } else { n }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Zipf logits: token i has probability ∝ (i + 1)^−s.
    fn zipf(n: usize, s: f32) -> Vec<f32> {
        (0..n).map(|i| -s * ((i + 1) as f32).ln()).collect()
    }

    #[test]
    fn version_1_recovers_the_zipf_exponent() {
        let logits = zipf(5000, 1.3);
        let mut top: Vec<Cand> =
            logits[..100].iter().enumerate().map(|(i, &l)| Cand { id: i as u32, logit: l }).collect();
        top.sort_unstable_by(by_logit_desc);
        // k is about the rank whose surprise is mu bits: the fit is exact, but the paper's closed form for the
        // Zipf normaliser is an integral, which undercounts the sum (3.1 against 3.9 here), so k runs high by ~20%.
        let z: f64 = (1..=5000).map(|r| (r as f64).powf(-1.3)).sum();
        for mu in [4.0f32, 6.0, 8.0] {
            let rank = (1..=5000).take_while(|&r| (r as f64).powf(-1.3) / z >= f64::from(mu).exp2().recip()).count();
            let k = zipf_k(&top, 1.0, mu, 5000);
            let ratio = k as f64 / rank as f64;
            assert!((1.0..1.35).contains(&ratio), "mu {mu}: k {k}, rank {rank}");
        }
        assert_eq!(zipf_k(&top[..1], 1.0, 4.0, 5000), 5000);
        let flat = vec![Cand { id: 0, logit: 0.0 }; 10];
        assert_eq!(zipf_k(&flat, 1.0, 4.0, 10), 10);
    }

    #[test]
    fn version_2_keeps_the_tokens_within_mu_bits() {
        // Probabilities 1/2, 1/4, 1/8, 1/8: surprises 1, 2, 3, 3 bits.
        let l = [0.5f32.ln(), 0.25f32.ln(), 0.125f32.ln(), 0.125f32.ln()];
        let p = MirostatParams { version: 2, ..MirostatParams::OFF };
        let kept = |mu: f32| {
            let mut c = Vec::new();
            candidates(&p, &l, (l[0], 0), 1.0, mu, &mut c);
            c.iter().map(|c| c.id).collect::<Vec<_>>()
        };
        assert_eq!(kept(0.5), vec![0], "at least the best");
        assert_eq!(kept(1.5), vec![0]);
        assert_eq!(kept(2.5), vec![0, 1]);
        assert_eq!(kept(3.5), vec![0, 1, 2, 3]);
        // The update: a 3-bit surprise against tau 5 raises mu by eta × 2.
        let q = MirostatParams { version: 2, tau: 5.0, eta: 0.1 };
        assert!((q.update(10.0, 0.125) - 10.2).abs() < 1e-6);
        assert!(MirostatParams { version: 3, ..q }.validate().is_err());
        assert!(MirostatParams { eta: f32::NAN, ..q }.validate().is_err());
    }
}
