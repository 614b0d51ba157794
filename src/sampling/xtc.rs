//! XTC ("exclude top choices"): now and then, take away the most obvious continuations, so that creative text
//! leaves the well-worn path without the incoherence of a high temperature. Proposed by p-e-w for
//! text-generation-webui (PR #6335, 2024) and offered by llama.cpp (`--xtc-*`) and koboldcpp; this is our own
//! implementation of the published definition.
//!
//! With probability `probability` per sampled token, every candidate at least `threshold` likely (at temperature 1,
//! over what the earlier filters left) is removed except the least likely of them; when fewer than two reach the
//! threshold nothing is removed, so a token the model is sure of (the only one above the threshold) always stays,
//! and so does the end of a sentence that must end. It runs after min-p and before the temperature (llama.cpp's
//! order), and a greedy sampler never uses it.

use serde::{Deserialize, Serialize};

use super::{Cand, SamplingError, exp_nonpos, max_of_cands};

/// XTC's knobs. See the [module docs](self).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct XtcParams {
    /// The chance that the top choices are excluded at a given token, in [0, 1]; 0 = off.
    pub probability: f32,
    /// How likely a token must be to count as a top choice, in [0, 1]; above 0.5 at most one token can be, so XTC
    /// does nothing.
    pub threshold: f32,
}

impl XtcParams {
    /// Off, with llama.cpp's default threshold for when a probability is given.
    pub const OFF: XtcParams = XtcParams { probability: 0.0, threshold: 0.1 };

    /// Whether XTC can change a draw (it also uses the RNG then).
    pub fn is_on(&self) -> bool {
        self.probability > 0.0 && self.threshold <= 0.5
    }

    pub(super) fn validate(&self) -> Result<(), SamplingError> {
        for (name, value) in [("xtc_probability", self.probability), ("xtc_threshold", self.threshold)] {
            if !(value.is_finite() && (0.0..=1.0).contains(&value)) {
                return Err(SamplingError::InvalidParam { name, value, expected: "a number in [0, 1]" });
            }
        }
        Ok(())
    }
}

impl Default for XtcParams {
    fn default() -> Self {
        XtcParams::OFF
    }
}

/// Removes the top choices from `cands` (whose largest logit is `max`): every candidate whose probability among
/// them is at least `threshold`, except the least likely of those (on a tie, the one drawn last). Returns the
/// largest logit left.
pub(super) fn exclude_top_choices(cands: &mut Vec<Cand>, max: f32, threshold: f32) -> f32 {
    let sum: f64 = cands.iter().map(|c| f64::from(exp_nonpos(c.logit - max))).sum();
    let cut = f64::from(threshold) * sum;
    let is_top = |c: &Cand| f64::from(exp_nonpos(c.logit - max)) >= cut;
    let mut count = 0usize;
    let mut kept: Option<Cand> = None;
    for c in cands.iter().filter(|c| is_top(c)) {
        count += 1;
        // The least likely top choice; among equals the later one (highest id), as llama.cpp's sorted list ends.
        if kept.is_none_or(|k| c.logit < k.logit || (c.logit == k.logit && c.id > k.id)) {
            kept = Some(*c);
        }
    }
    let Some(kept) = kept.filter(|_| count >= 2) else { return max };
    cands.retain(|c| c.id == kept.id || !is_top(c));
    max_of_cands(cands)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cands(logits: &[f32]) -> Vec<Cand> {
        logits.iter().enumerate().map(|(i, &logit)| Cand { id: i as u32, logit }).collect()
    }

    #[test]
    fn removes_all_top_choices_but_the_least_likely() {
        // Probabilities about 0.53, 0.20, 0.20, 0.07.
        let ln = |p: f32| p.ln();
        let mut c = cands(&[ln(0.53), ln(0.2), ln(0.2), ln(0.07)]);
        let max = exclude_top_choices(&mut c, ln(0.53), 0.1);
        let ids: Vec<u32> = c.iter().map(|c| c.id).collect();
        assert_eq!(ids, [2, 3], "the tie between 1 and 2 keeps the later one");
        assert_eq!(max, ln(0.2));
    }

    #[test]
    fn one_top_choice_is_left_alone() {
        let mut c = cands(&[0.0, -5.0, -6.0]);
        assert_eq!(exclude_top_choices(&mut c, 0.0, 0.1), 0.0);
        assert_eq!(c.len(), 3);
        // A threshold above one half can never find two.
        let mut c = cands(&[0.0, 0.0]);
        exclude_top_choices(&mut c, 0.0, 0.6);
        assert_eq!(c.len(), 2);
    }

    #[test]
    fn params_are_checked() {
        assert!(XtcParams { probability: 0.5, threshold: 0.1 }.validate().is_ok());
        assert!(XtcParams { probability: 1.5, threshold: 0.1 }.validate().is_err());
        assert!(XtcParams { probability: 0.5, threshold: f32::NAN }.validate().is_err());
        assert!(!XtcParams { probability: 0.5, threshold: 0.6 }.is_on());
    }
}
