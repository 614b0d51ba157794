//! Dynamic temperature (entropy-based; kalomaze's proposal, llama.cpp's `--dynatemp-range`/`--dynatemp-exp`,
//! llama-server's `dynatemp_range`/`dynatemp_exponent`); our own implementation of the published definition.
//!
//! Where the model is sure (low entropy) a high temperature only adds mistakes; where it is unsure the choice is
//! open anyway. So the temperature follows the normalized entropy `h = H / ln n` of the `n` candidates the filters
//! left (at temperature 1): `T = T_min + (T_max − T_min) · h^exponent`, with `T_min = max(0, temp − range)` and
//! `T_max = temp + range`. It replaces the fixed temperature of the last step and changes nothing else.

use serde::{Deserialize, Serialize};

use super::{Cand, SamplingError, softmax_entropy};

/// Dynamic temperature's knobs. See the [module docs](self).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct DynatempParams {
    /// How far the temperature may move either way from the base temperature, ≥ 0; 0 = off.
    pub range: f32,
    /// How the temperature follows the normalized entropy, > 0: 1 linearly, above 1 staying low longer.
    pub exponent: f32,
}

impl DynatempParams {
    /// Off, with llama.cpp's default exponent for when a range is given.
    pub const OFF: DynatempParams = DynatempParams { range: 0.0, exponent: 1.0 };

    pub fn is_on(&self) -> bool {
        self.range > 0.0
    }

    pub(super) fn validate(&self) -> Result<(), SamplingError> {
        let check = |name, value: f32, ok: bool, expected| {
            if value.is_finite() && ok { Ok(()) } else { Err(SamplingError::InvalidParam { name, value, expected }) }
        };
        check("dynatemp_range", self.range, self.range >= 0.0, "a number >= 0 (0 = off)")?;
        check("dynatemp_exponent", self.exponent, self.exponent > 0.0, "a number > 0")
    }

    /// The temperature for `cands` (largest logit `max`) around the base temperature `base`.
    pub(super) fn temperature(&self, base: f32, cands: &[Cand], max: f32) -> f32 {
        let low = (base - self.range).max(0.0);
        let high = base + self.range;
        if cands.len() < 2 {
            return low;
        }
        let (_, entropy) = softmax_entropy(cands, max);
        let normalized = (entropy / (cands.len() as f64).ln()).clamp(0.0, 1.0);
        low + (high - low) * normalized.powf(f64::from(self.exponent)) as f32
    }
}

impl Default for DynatempParams {
    fn default() -> Self {
        DynatempParams::OFF
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cands(logits: &[f32]) -> Vec<Cand> {
        logits.iter().enumerate().map(|(i, &l)| Cand { id: i as u32, logit: l }).collect()
    }

    #[test]
    fn the_temperature_follows_the_entropy() {
        let p = DynatempParams { range: 0.5, exponent: 1.0 };
        // A flat distribution has the largest entropy: the top of the range.
        assert!((p.temperature(1.0, &cands(&[0.0; 8]), 0.0) - 1.5).abs() < 1e-5);
        // A near-certain one: the bottom, clamped at 0.
        let sure = cands(&[0.0, -80.0, -80.0]);
        assert!(p.temperature(1.0, &sure, 0.0) - 0.5 < 1e-3);
        assert!(p.temperature(0.3, &sure, 0.0) < 1e-3);
        // Halfway: two of four tokens equally likely, the others negligible → h = ln 2 / ln 4 = 0.5.
        let half = cands(&[0.0, 0.0, -90.0, -90.0]);
        assert!((p.temperature(1.0, &half, 0.0) - 1.0).abs() < 1e-4);
        let steep = DynatempParams { exponent: 2.0, ..p };
        assert!((steep.temperature(1.0, &half, 0.0) - 0.75).abs() < 1e-4, "h² = 0.25");
        assert!(p.validate().is_ok());
        assert!(DynatempParams { exponent: 0.0, ..p }.validate().is_err());
        assert!(DynatempParams { range: -1.0, ..p }.validate().is_err());
    }
}
