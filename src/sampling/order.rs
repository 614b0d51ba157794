//! The order of the sampling steps (`--samplers`, llama.cpp's flag of the same name; `--sampling-seq` for its
//! one-letter form).
//!
//! The default order is the [pipeline](super) the sampler's fused path runs: penalties, DRY, top-nσ, top-k,
//! typical, top-p, min-p, XTC, temperature. Another order, or a subset, runs each listed step in turn on the
//! candidates, as llama.cpp's sampler chain does: a step left out does not run (penalties and DRY included), the
//! temperature rescales the logits where it stands, so the filters after it measure the rescaled distribution, and
//! the draw is from what the last step left, at temperature 1 if the temperature is not listed. Greedy decoding
//! (temperature 0, or top-k 1 where top-k is listed) takes the most likely token after the listed penalties and
//! DRY, as the fused path does. Mirostat replaces the filters whatever the order (as in llama.cpp).

use std::fmt;

use rand::Rng;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use super::{
    Cand, Prepared, Sampler, SamplingError, allowed, apply_penalties, biased_copy, by_logit_desc, check_logits, dry,
    exp_nonpos, max_of_cands, sigma_floor, top_p_cut, typical, xtc,
};

/// One step of the order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    Penalties,
    Dry,
    TopNSigma,
    TopK,
    Typical,
    TopP,
    MinP,
    Xtc,
    Temperature,
}

impl Step {
    const ALL: [Step; 9] = [
        Step::Penalties,
        Step::Dry,
        Step::TopNSigma,
        Step::TopK,
        Step::Typical,
        Step::TopP,
        Step::MinP,
        Step::Xtc,
        Step::Temperature,
    ];

    /// The name llama.cpp's `--samplers` uses.
    pub fn name(self) -> &'static str {
        match self {
            Step::Penalties => "penalties",
            Step::Dry => "dry",
            Step::TopNSigma => "top_n_sigma",
            Step::TopK => "top_k",
            Step::Typical => "typ_p",
            Step::TopP => "top_p",
            Step::MinP => "min_p",
            Step::Xtc => "xtc",
            Step::Temperature => "temperature",
        }
    }

    /// The letter llama.cpp's `--sampling-seq` uses.
    pub fn letter(self) -> char {
        match self {
            Step::Penalties => 'e',
            Step::Dry => 'd',
            Step::TopNSigma => 's',
            Step::TopK => 'k',
            Step::Typical => 'y',
            Step::TopP => 'p',
            Step::MinP => 'm',
            Step::Xtc => 'x',
            Step::Temperature => 't',
        }
    }

    /// A step by its name, or by one of the other spellings llama.cpp accepts (`top-k`, `typical`, `nucleus`,
    /// `temp`, ...).
    fn from_name(name: &str) -> Option<Step> {
        let n = name.trim().to_ascii_lowercase().replace('-', "_");
        Some(match n.as_str() {
            "penalties" | "penalty" | "repetition" => Step::Penalties,
            "dry" => Step::Dry,
            "top_n_sigma" | "top_nsigma" | "nsigma" => Step::TopNSigma,
            "top_k" | "k" => Step::TopK,
            "typ_p" | "typical_p" | "typical" | "typ" => Step::Typical,
            "top_p" | "nucleus" => Step::TopP,
            "min_p" => Step::MinP,
            "xtc" => Step::Xtc,
            "temperature" | "temp" => Step::Temperature,
            _ => return None,
        })
    }
}

/// The steps to run, in order: each at most once.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct SamplerOrder {
    steps: [Step; 9],
    len: u8,
}

impl SamplerOrder {
    /// llama.cpp's default order, which the fused path runs.
    pub const DEFAULT: SamplerOrder = SamplerOrder { steps: Step::ALL, len: 9 };

    pub fn steps(&self) -> &[Step] {
        &self.steps[..usize::from(self.len)]
    }

    pub fn is_default(&self) -> bool {
        *self == SamplerOrder::DEFAULT
    }

    pub fn contains(&self, step: Step) -> bool {
        self.steps().contains(&step)
    }

    fn from_steps(steps: impl IntoIterator<Item = Result<Step, String>>) -> Result<SamplerOrder, String> {
        let mut order = SamplerOrder { steps: Step::ALL, len: 0 };
        for step in steps {
            let step = step?;
            if order.contains(step) {
                return Err(format!("`{}` is listed twice", step.name()));
            }
            order.steps[usize::from(order.len)] = step;
            order.len += 1;
        }
        Ok(order)
    }

    /// `--samplers`: names separated by `;` (llama.cpp's separator) or `,`; an empty list runs no filter (the draw
    /// is then from the whole distribution at temperature 1).
    pub fn parse(text: &str) -> Result<SamplerOrder, String> {
        let names = text.split([';', ',']).map(str::trim).filter(|n| !n.is_empty());
        SamplerOrder::from_steps(names.map(|n| {
            Step::from_name(n).ok_or_else(|| {
                let known: Vec<&str> = Step::ALL.iter().map(|s| s.name()).collect();
                format!("unknown sampler `{n}` (known: {})", known.join(", "))
            })
        }))
    }

    /// `--sampling-seq`: one letter per step (`edskypmxt` is the default).
    pub fn parse_letters(text: &str) -> Result<SamplerOrder, String> {
        SamplerOrder::from_steps(text.trim().chars().map(|c| {
            Step::ALL.into_iter().find(|s| s.letter() == c).ok_or_else(|| {
                let known: String = Step::ALL.iter().map(|s| s.letter()).collect();
                format!("unknown sampler letter `{c}` (known: {known})")
            })
        }))
    }
}

impl Default for SamplerOrder {
    fn default() -> Self {
        SamplerOrder::DEFAULT
    }
}

impl fmt::Display for SamplerOrder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names: Vec<&str> = self.steps().iter().map(|s| s.name()).collect();
        f.write_str(&names.join(";"))
    }
}

impl fmt::Debug for SamplerOrder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "SamplerOrder({self})")
    }
}

impl Serialize for SamplerOrder {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for SamplerOrder {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<SamplerOrder, D::Error> {
        let text = String::deserialize(d)?;
        SamplerOrder::parse(&text).map_err(serde::de::Error::custom)
    }
}

impl Sampler {
    /// Whether this sampler runs its steps one by one ([`Sampler::filter_ordered`]) rather than fused.
    pub(super) fn ordered(&self) -> bool {
        !self.params.samplers.is_default() && !self.params.mirostat.is_on()
    }

    /// The steps of [`SamplingParams::samplers`](super::SamplingParams::samplers) in their order, on candidates
    /// with their real ids (the mask, if any, chooses the first candidates). The candidates' logits end up at the
    /// temperature the order applied, so the draw runs at temperature 1 (see [`Sampler::weigh`]).
    ///
    /// `toss_xtc`: whether XTC may toss its coin ([`Sampler::distribution`] leaves XTC out). A greedy sampler
    /// runs only the penalties and DRY (if listed) and takes the most likely token, and never touches the RNG.
    pub(super) fn filter_ordered(
        &mut self,
        logits: &[f32],
        history: &[u32],
        mask: Option<&[u64]>,
        toss_xtc: bool,
    ) -> Result<Prepared, SamplingError> {
        check_logits(logits)?;
        let Sampler {
            params,
            ln_min_p,
            rng,
            bias,
            penalized: work,
            recent,
            cands,
            weights: scratch,
            top_p: top_p_scratch,
            dry_breakers,
            dry: dry_scratch,
            typical_ranked,
            typical_kept,
            ..
        } = self;
        // `work` holds every candidate's current logit at its id; the logits of other ids do not matter.
        biased_copy(logits, bias, work)?;
        cands.clear();
        match mask {
            None => cands.extend(work.iter().enumerate().map(|(i, &l)| Cand { id: i as u32, logit: l })),
            Some(mask) => cands.extend(allowed(mask, work.len()).map(|id| Cand { id, logit: work[id as usize] })),
        }
        let banned = bias.entries().iter().any(|&(_, b)| b == f32::NEG_INFINITY);
        if cands.is_empty() || (banned && cands.iter().all(|c| c.logit == f32::MIN)) {
            return Err(SamplingError::NothingAllowed);
        }
        // Whether `cands` is in `by_logit_desc` order (the filters that need it sort it once).
        let mut sorted = false;
        let sort = |cands: &mut Vec<Cand>, sorted: &mut bool| {
            if !*sorted {
                cands.sort_unstable_by(by_logit_desc);
                *sorted = true;
            }
        };
        let window = &history[history.len().saturating_sub(params.repeat_last_n)..];
        // Greedy is the most likely token after the penalties and DRY that are listed, as on the fused path: the
        // filters keep the most likely token, but for typical sampling, which greedy decoding does not run.
        let greedy = params.is_greedy();
        for &step in params.samplers.steps() {
            if cands.len() <= 1 {
                break;
            }
            if greedy && !matches!(step, Step::Penalties | Step::Dry) {
                continue;
            }
            match step {
                Step::Penalties if params.penalizes() && !window.is_empty() => {
                    rescore(cands, work, |w| apply_penalties(window, params, w, recent))?;
                    sorted = false;
                }
                Step::Dry if params.dry.is_on() && history.len() > 1 => {
                    rescore(cands, work, |w| dry::apply(history, &params.dry, dry_breakers, w, dry_scratch))?;
                    sorted = false;
                }
                Step::TopNSigma if params.top_n_sigma > 0.0 => {
                    scratch.clear();
                    scratch.extend(cands.iter().map(|c| c.logit));
                    let floor = sigma_floor(scratch, max_of_cands(cands), params.top_n_sigma);
                    cands.retain(|c| c.logit >= floor);
                }
                Step::TopK if params.top_k > 0 && params.top_k < cands.len() => {
                    if !sorted {
                        cands.select_nth_unstable_by(params.top_k - 1, by_logit_desc);
                        cands.truncate(params.top_k);
                    }
                    sort(cands, &mut sorted);
                    cands.truncate(params.top_k);
                }
                Step::Typical if params.typical_p < 1.0 => {
                    sort(cands, &mut sorted);
                    let max = max_of_cands(cands);
                    typical::keep_typical(cands, max, params.typical_p, typical_ranked, typical_kept);
                }
                Step::TopP if params.top_p < 1.0 => {
                    let max = max_of_cands(cands);
                    let mass: f64 = cands.iter().map(|c| f64::from(exp_nonpos(c.logit - max))).sum();
                    top_p_cut(cands, max, f64::from(params.top_p) * mass, sorted, top_p_scratch);
                }
                Step::MinP if params.min_p > 0.0 => {
                    let max = max_of_cands(cands);
                    cands.retain(|c| c.logit - max >= *ln_min_p);
                }
                // The coin is tossed where XTC stands (in the guard), as the fused path tosses it after its filters.
                Step::Xtc if params.xtc.is_on() && toss_xtc && rng.random::<f32>() < params.xtc.probability => {
                    sort(cands, &mut sorted);
                    let max = max_of_cands(cands);
                    xtc::exclude_top_choices(cands, max, params.xtc.threshold);
                }
                Step::Temperature => {
                    let max = max_of_cands(cands);
                    let t = if params.dynatemp.is_on() {
                        params.dynatemp.temperature(params.temperature, cands, max)
                    } else {
                        params.temperature
                    };
                    if t <= 0.0 {
                        // The most likely candidate (the first of equal maxima in the draw order).
                        let best = cands.iter().position(|c| c.logit == max).unwrap_or(0);
                        let keep = cands[best];
                        cands.clear();
                        cands.push(keep);
                    } else {
                        // As the fused path's draw: the logit's distance from the max over the temperature.
                        for c in cands.iter_mut() {
                            c.logit = (c.logit - max) / t;
                        }
                    }
                }
                _ => {}
            }
        }
        if greedy && cands.len() > 1 {
            sort(cands, &mut sorted);
            cands.truncate(1);
        }
        match cands.as_slice() {
            [] => Err(SamplingError::NothingAllowed),
            [only] => Ok(Prepared::Greedy(only.id)),
            _ => Ok(Prepared::Candidates { max: max_of_cands(cands) }),
        }
    }
}

/// Runs a step that rewrites logits by token id (the penalties, DRY) on the candidates: their current logits go
/// into `work` at their ids, `step` changes them there, and they come back.
fn rescore(
    cands: &mut [Cand],
    work: &mut [f32],
    step: impl FnOnce(&mut [f32]) -> Result<(), SamplingError>,
) -> Result<(), SamplingError> {
    for c in cands.iter() {
        work[c.id as usize] = c.logit;
    }
    step(work)?;
    for c in cands.iter_mut() {
        c.logit = work[c.id as usize];
    }
    Ok(())
}
