//! The sampler on arbitrary logits (NaN, ±inf, all equal, empty) with arbitrary parameters, logit biases and
//! history (DRY's breakers, XTC, typical, dynamic temperature and Mirostat included), in the default order of the
//! steps or another (`--samplers`): it returns a token of the vocabulary or an error, and never panics; a banned
//! token is never returned.
#![no_main]

use arbitrary::Arbitrary;
use std::sync::Arc;

use infer::sampling::{
    DryParams, DynatempParams, LogitBias, MirostatParams, Sampler, SamplerOrder, SamplingParams, XtcParams,
};
use libfuzzer_sys::fuzz_target;

#[derive(Arbitrary, Debug)]
struct Input {
    temperature: f32,
    top_k: u32,
    top_p: f32,
    min_p: f32,
    top_n_sigma: f32,
    repeat_penalty: f32,
    repeat_last_n: u16,
    presence_penalty: f32,
    frequency_penalty: f32,
    dry_multiplier: f32,
    dry_base: f32,
    dry_allowed_length: u8,
    dry_penalty_last_n: i16,
    dry_breakers: Vec<u32>,
    xtc_probability: f32,
    xtc_threshold: f32,
    typical_p: f32,
    dynatemp_range: f32,
    dynatemp_exponent: f32,
    mirostat: u8,
    mirostat_tau: f32,
    mirostat_eta: f32,
    bias: Vec<(u32, f32)>,
    seed: u64,
    /// Steps of another order, as indices into `--sampling-seq`'s letters (repeats skipped); `None`: the default.
    order: Option<Vec<u8>>,
    logits: Vec<f32>,
    repeat: u16,
    history: Vec<u32>,
    draws: u8,
}

fuzz_target!(|input: Input| {
    let params = SamplingParams {
        temperature: input.temperature,
        top_k: input.top_k as usize,
        top_p: input.top_p,
        min_p: input.min_p,
        top_n_sigma: input.top_n_sigma,
        repeat_penalty: input.repeat_penalty,
        repeat_last_n: input.repeat_last_n as usize,
        presence_penalty: input.presence_penalty,
        frequency_penalty: input.frequency_penalty,
        dry: DryParams {
            multiplier: input.dry_multiplier,
            base: input.dry_base,
            allowed_length: usize::from(input.dry_allowed_length),
            penalty_last_n: i64::from(input.dry_penalty_last_n),
        },
        xtc: XtcParams { probability: input.xtc_probability, threshold: input.xtc_threshold },
        typical_p: input.typical_p,
        dynatemp: DynatempParams { range: input.dynatemp_range, exponent: input.dynatemp_exponent },
        // Mostly 0, 1 or 2, sometimes out of range (refused).
        mirostat: MirostatParams { version: input.mirostat % 4, tau: input.mirostat_tau, eta: input.mirostat_eta },
        seed: input.seed,
        samplers: match &input.order {
            None => SamplerOrder::DEFAULT,
            Some(steps) => {
                let mut letters = String::new();
                for &s in steps {
                    let c = b"edskypmxt"[usize::from(s) % 9] as char;
                    if !letters.contains(c) {
                        letters.push(c);
                    }
                }
                SamplerOrder::parse_letters(&letters).expect("distinct known letters")
            }
        },
    };
    let Ok(mut sampler) = Sampler::new(params) else { return };
    let mut breakers = input.dry_breakers.clone();
    breakers.sort_unstable();
    breakers.dedup();
    sampler.set_dry_breakers(Arc::from(breakers));
    let Ok(bias) = LogitBias::new(input.bias.iter().copied()) else { return };
    sampler.set_logit_bias(bias.clone());
    // Logits repeated up to a vocabulary's size, so the large-vocabulary paths run too.
    let mut logits = input.logits.clone();
    for _ in 0..(input.repeat % 64) {
        logits.extend_from_slice(&input.logits);
    }
    for _ in 0..=(input.draws % 4) {
        if let Ok(t) = sampler.sample(&logits, &input.history) {
            assert!((t as usize) < logits.len(), "token {t} of {}", logits.len());
            let banned = bias.entries().iter().any(|&(id, b)| id == t && b == f32::NEG_INFINITY);
            assert!(!banned, "token {t} is banned");
        }
    }
});
