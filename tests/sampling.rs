//! Sampling, stop strings and the shared sampling/thread flags.

use infer::sampling::{DynatempParams, LogitBias, Sampler, SamplingError, SamplingParams, argmax};

/// No filters, temperature 1: plain softmax sampling.
fn plain(seed: u64) -> SamplingParams {
    SamplingParams { temperature: 1.0, seed, ..SamplingParams::GREEDY }
}

/// Deterministic pseudo-random logits over a vocabulary of `n`.
pub(crate) fn logits(n: usize, salt: u64) -> Vec<f32> {
    let mut x = salt.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            ((x >> 40) as f32 / (1u64 << 24) as f32) * 12.0 - 6.0
        })
        .collect()
}

fn counts(sampler: &mut Sampler, logits: &[f32], history: &[u32], draws: usize) -> Vec<usize> {
    let mut counts = vec![0usize; logits.len()];
    for _ in 0..draws {
        counts[sampler.sample(logits, history).unwrap() as usize] += 1;
    }
    counts
}

#[test]
fn defaults_are_llama_cpp_s() {
    let p = SamplingParams::default();
    assert_eq!((p.temperature, p.top_k, p.top_p, p.min_p), (0.8, 40, 0.95, 0.05));
    assert_eq!((p.repeat_penalty, p.repeat_last_n), (1.0, 64));
    assert_eq!((p.presence_penalty, p.frequency_penalty), (0.0, 0.0));
    p.validate().unwrap();
    SamplingParams::GREEDY.validate().unwrap();
}

#[test]
fn validate_rejects_nan_negative_and_out_of_range() {
    let bad = [
        SamplingParams { temperature: f32::NAN, ..Default::default() },
        SamplingParams { temperature: -0.1, ..Default::default() },
        SamplingParams { temperature: f32::INFINITY, ..Default::default() },
        SamplingParams { top_p: 0.0, ..Default::default() },
        SamplingParams { top_p: 1.01, ..Default::default() },
        SamplingParams { top_p: f32::NAN, ..Default::default() },
        SamplingParams { min_p: -0.01, ..Default::default() },
        SamplingParams { min_p: 1.5, ..Default::default() },
        SamplingParams { min_p: f32::NAN, ..Default::default() },
        SamplingParams { repeat_penalty: 0.0, ..Default::default() },
        SamplingParams { repeat_penalty: -1.0, ..Default::default() },
        SamplingParams { repeat_penalty: f32::NAN, ..Default::default() },
        SamplingParams { presence_penalty: 2.01, ..Default::default() },
        SamplingParams { presence_penalty: f32::NAN, ..Default::default() },
        SamplingParams { frequency_penalty: -2.5, ..Default::default() },
        SamplingParams { frequency_penalty: f32::INFINITY, ..Default::default() },
    ];
    for params in bad {
        assert!(matches!(params.validate(), Err(SamplingError::InvalidParam { .. })), "{params:?}");
        assert!(Sampler::new(params).is_err(), "{params:?}");
    }
    let fine = [
        SamplingParams { temperature: 0.0, ..Default::default() },
        SamplingParams { top_k: 0, top_p: 1.0, min_p: 0.0, ..Default::default() },
        SamplingParams { min_p: 1.0, ..Default::default() },
        SamplingParams { repeat_penalty: 0.5, ..Default::default() },
    ];
    for params in fine {
        params.validate().unwrap();
    }
}

#[test]
fn argmax_ties_go_to_the_lowest_id() {
    assert_eq!(argmax(&[1.0, 3.0, 2.0, 3.0]), 1);
    assert_eq!(argmax(&[-5.0, -5.0]), 0);
    assert_eq!(argmax(&[f32::NAN, 1.0, f32::NAN]), 1);
    assert_eq!(argmax(&[]), 0);
}

#[test]
fn same_seed_same_sequence() {
    let vocab = logits(50_000, 7);
    for params in [
        SamplingParams { seed: 1234, ..Default::default() },
        plain(99),
        SamplingParams { top_k: 0, seed: 5, ..Default::default() },
    ] {
        let run = || {
            let mut sampler = Sampler::new(params).unwrap();
            let mut history = Vec::new();
            for step in 0..40u64 {
                let l = logits(50_000, step);
                let token = sampler.sample(&l, &history).unwrap();
                history.push(token);
            }
            history
        };
        let a = run();
        assert_eq!(a, run());
        // And a different seed gives a different sequence.
        let mut other = Sampler::new(SamplingParams { seed: params.seed + 1, ..params }).unwrap();
        let b: Vec<u32> = (0..40).map(|_| other.sample(&vocab, &[]).unwrap()).collect();
        let mut same = Sampler::new(params).unwrap();
        let c: Vec<u32> = (0..40).map(|_| same.sample(&vocab, &[]).unwrap()).collect();
        assert_ne!(b, c, "{params:?}");
    }
}

#[test]
fn reseed_restarts_the_sequence() {
    let l = logits(1000, 3);
    let mut sampler = Sampler::new(plain(42)).unwrap();
    let first: Vec<u32> = (0..20).map(|_| sampler.sample(&l, &[]).unwrap()).collect();
    sampler.reseed(42);
    let again: Vec<u32> = (0..20).map(|_| sampler.sample(&l, &[]).unwrap()).collect();
    assert_eq!(first, again);
}

#[test]
fn greedy_paths_give_the_argmax() {
    for salt in 0..20 {
        let l = logits(32_000, salt);
        let want = argmax(&l);
        let greedy = [
            SamplingParams { temperature: 0.0, ..Default::default() },
            SamplingParams { top_k: 1, ..plain(salt) },
            SamplingParams { top_p: 1e-9, ..plain(salt) },
            SamplingParams { top_p: 1e-9, top_k: 100, ..plain(salt) },
            SamplingParams { min_p: 1.0, ..plain(salt) },
        ];
        for params in greedy {
            let mut sampler = Sampler::new(params).unwrap();
            for _ in 0..5 {
                assert_eq!(sampler.sample(&l, &[]).unwrap(), want, "{params:?}");
            }
        }
    }
    // Ties: the lowest id, even through the filters.
    let tied = [0.5, 2.0, 1.0, 2.0, 2.0];
    for params in
        [SamplingParams::GREEDY, SamplingParams { top_k: 1, ..plain(0) }, SamplingParams { top_p: 1e-6, ..plain(0) }]
    {
        assert_eq!(Sampler::new(params).unwrap().sample(&tied, &[]).unwrap(), 1);
    }
}

#[test]
fn top_k_keeps_the_k_best() {
    let l = logits(10_000, 11);
    let mut sorted: Vec<(f32, u32)> = l.iter().enumerate().map(|(i, &v)| (v, i as u32)).collect();
    sorted.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
    for k in [2, 40, 64, 65, 200, 9_999] {
        let mut sampler = Sampler::new(SamplingParams { top_k: k, ..plain(0) }).unwrap();
        let dist = sampler.distribution(&l, &[]).unwrap();
        let mut got: Vec<u32> = dist.iter().map(|t| t.id).collect();
        let mut want: Vec<u32> = sorted[..k].iter().map(|&(_, i)| i).collect();
        // Most likely first.
        assert_eq!(got, want, "k = {k}");
        got.sort_unstable();
        want.sort_unstable();
        let total: f32 = dist.iter().map(|t| t.prob).sum();
        assert!((total - 1.0).abs() < 1e-4);
    }
    // Ties at the cut go to the lowest ids.
    let flat = vec![1.0f32; 300];
    let mut sampler = Sampler::new(SamplingParams { top_k: 100, ..plain(0) }).unwrap();
    let ids: Vec<u32> = sampler.distribution(&flat, &[]).unwrap().iter().map(|t| t.id).collect();
    assert_eq!(ids, (0..100).collect::<Vec<u32>>());
}

/// The smallest most-likely-first prefix whose softmax mass reaches `p`, computed the slow way.
fn nucleus(l: &[f32], p: f64) -> Vec<u32> {
    let max = l.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let z: f64 = l.iter().map(|&v| f64::from(v - max).exp()).sum();
    let mut order: Vec<u32> = (0..l.len() as u32).collect();
    order.sort_by(|&a, &b| l[b as usize].total_cmp(&l[a as usize]).then(a.cmp(&b)));
    let mut cum = 0.0;
    let mut out = Vec::new();
    for id in order {
        out.push(id);
        cum += f64::from(l[id as usize] - max).exp() / z;
        if cum >= p {
            break;
        }
    }
    out
}

#[test]
fn top_p_keeps_the_nucleus() {
    // Sharpness 1 leaves thousands of tokens in the nucleus (histogram path), 6 a few hundred (sorted path).
    for (salt, p, sharpness) in [
        (1, 0.5f32, 1.0f32),
        (2, 0.9, 1.0),
        (3, 0.95, 1.0),
        (4, 0.99, 1.0),
        (5, 0.2, 1.0),
        (6, 0.9, 6.0),
        (7, 0.5, 6.0),
    ] {
        let l: Vec<f32> = logits(20_000, salt).iter().map(|v| v * sharpness).collect();
        let want = nucleus(&l, f64::from(p));
        // Without top-k, and with a top-k that cuts nothing or almost nothing (sorted path).
        for top_k in [0, 20_000, 19_999] {
            let mut sampler = Sampler::new(SamplingParams { top_p: p, top_k, ..plain(0) }).unwrap();
            let mut got: Vec<u32> = sampler.distribution(&l, &[]).unwrap().iter().map(|t| t.id).collect();
            got.sort_by(|&a, &b| l[b as usize].total_cmp(&l[a as usize]).then(a.cmp(&b)));
            // Rounding may move the cut by one token at most.
            let n = want.len().min(got.len());
            assert_eq!(got[..n], want[..n], "p = {p}, top_k = {top_k}");
            assert!(got.len().abs_diff(want.len()) <= 1, "p = {p}: {} vs {}", got.len(), want.len());
        }
    }
    // Exact on a small case: probabilities 0.5, 0.25, 0.125, 0.125.
    let l = [0.5f32.ln(), 0.25f32.ln(), 0.125f32.ln(), 0.125f32.ln()];
    let mut sampler = Sampler::new(SamplingParams { top_p: 0.7, ..plain(0) }).unwrap();
    let dist = sampler.distribution(&l, &[]).unwrap();
    assert_eq!(dist.iter().map(|t| t.id).collect::<Vec<_>>(), [0, 1]);
    assert!((dist[0].prob - 2.0 / 3.0).abs() < 1e-5);
}

#[test]
fn min_p_filters_unlikely_tokens() {
    // Probabilities relative to the best: 1, 0.5, 0.1, 0.04, 0.01.
    let l = [0.0f32, 0.5f32.ln(), 0.1f32.ln(), 0.04f32.ln(), 0.01f32.ln()];
    for (min_p, want) in
        [(0.05f32, vec![0u32, 1, 2]), (0.2, vec![0, 1]), (0.0, vec![0, 1, 2, 3, 4]), (0.009, vec![0, 1, 2, 3, 4])]
    {
        for top_k in [0, 3, 4] {
            let mut sampler = Sampler::new(SamplingParams { min_p, top_k, ..plain(0) }).unwrap();
            let mut got: Vec<u32> = sampler.distribution(&l, &[]).unwrap().iter().map(|t| t.id).collect();
            got.sort_unstable();
            let mut want = want.clone();
            want.truncate(if top_k == 0 { 5 } else { top_k });
            assert_eq!(got, want, "min_p = {min_p}, top_k = {top_k}");
        }
        let mut sampler = Sampler::new(SamplingParams { min_p, ..plain(8) }).unwrap();
        for _ in 0..500 {
            assert!(want.contains(&sampler.sample(&l, &[]).unwrap()));
        }
    }
}

/// Top-nσ keeps the tokens within n standard deviations of the top logit, whatever the temperature: a clear head of
/// four tokens over 2,000 of noise.
#[test]
fn top_n_sigma_keeps_the_head_at_any_temperature() {
    let mut l: Vec<f32> = logits(2000, 5).iter().map(|v| v * 0.2).collect();
    for (i, v) in [9.0f32, 8.5, 8.0, 7.0].into_iter().enumerate() {
        l[i] = v;
    }
    for temperature in [0.3f32, 1.0, 3.0] {
        let params = SamplingParams { top_n_sigma: 1.0, temperature, seed: 1, ..SamplingParams::GREEDY };
        let mut s = Sampler::new(params).unwrap();
        let mut ids: Vec<u32> = s.distribution(&l, &[]).unwrap().iter().map(|t| t.id).collect();
        ids.sort_unstable();
        // The noise is uniform on ±1.2, so σ is about 0.78 and the floor near 8.2: the two best stay.
        assert_eq!(ids, [0, 1], "t = {temperature}");
        // Without it the noise takes most of the mass at a high temperature.
        let off = SamplingParams { top_n_sigma: -1.0, ..params };
        assert!(Sampler::new(off).unwrap().distribution(&l, &[]).unwrap().len() > 1000);
    }
    // A banned token does not count towards σ.
    let mut s = Sampler::new(SamplingParams { top_n_sigma: 1.0, temperature: 1.0, ..SamplingParams::GREEDY }).unwrap();
    s.set_logit_bias(LogitBias::new([(5, f32::NEG_INFINITY)]).unwrap());
    assert_eq!(s.distribution(&l, &[]).unwrap().len(), 2, "a banned token's f32::MIN would make σ huge");
    assert!(Sampler::new(SamplingParams { top_n_sigma: f32::NAN, ..SamplingParams::DEFAULT }).is_err());
}

#[test]
fn min_p_after_top_p() {
    // Top-p's mass is measured before min-p drops anything: probabilities 0.4, 0.3, 0.2, 0.1 with top-p 0.8
    // keep 0, 1, 2; min-p 0.6 then keeps 0, 1.
    let l = [0.4f32.ln(), 0.3f32.ln(), 0.2f32.ln(), 0.1f32.ln()];
    for top_k in [0, 4, 3] {
        let mut sampler = Sampler::new(SamplingParams { top_p: 0.8, min_p: 0.6, top_k, ..plain(0) }).unwrap();
        let ids: Vec<u32> = sampler.distribution(&l, &[]).unwrap().iter().map(|t| t.id).collect();
        assert_eq!(ids, [0, 1], "top_k = {top_k}");
    }
    let mut sampler = Sampler::new(SamplingParams { top_p: 0.8, min_p: 0.0, ..plain(0) }).unwrap();
    let ids: Vec<u32> = sampler.distribution(&l, &[]).unwrap().iter().map(|t| t.id).collect();
    assert_eq!(ids, [0, 1, 2]);
}

#[test]
fn temperature_sharpens_and_flattens() {
    let l = [1.0f32, 0.0];
    let p0 = |t: f32| {
        let mut sampler = Sampler::new(SamplingParams { temperature: t, ..plain(0) }).unwrap();
        let dist = sampler.distribution(&l, &[]).unwrap();
        dist.iter().find(|p| p.id == 0).unwrap().prob
    };
    let e = std::f32::consts::E;
    assert!((p0(1.0) - e / (e + 1.0)).abs() < 1e-5);
    assert!((p0(0.5) - e * e / (e * e + 1.0)).abs() < 1e-5);
    assert!(p0(100.0) < 0.51);
    assert!((p0(1e-30) - 1.0).abs() < 1e-6);
}

#[test]
fn repeat_penalty_lowers_repeated_tokens() {
    // Positive logits are divided, negative ones multiplied.
    let l = [2.0f32, 2.0, -1.0, -1.0, 0.0];
    let params = SamplingParams { repeat_penalty: 2.0, repeat_last_n: 64, ..plain(3) };
    let mut sampler = Sampler::new(params).unwrap();
    let history = [0u32, 2, 0, 0];
    let dist: Vec<_> = sampler.distribution(&l, &history).unwrap().to_vec();
    let prob = |id: u32| dist.iter().find(|t| t.id == id).unwrap().prob;
    let z = 1f32.exp() + 2f32.exp() + (-2f32).exp() + (-1f32).exp() + 1.0;
    assert!((prob(0) - 1f32.exp() / z).abs() < 1e-5, "each token is penalized once, however often it repeats");
    assert!((prob(1) - 2f32.exp() / z).abs() < 1e-5);
    assert!((prob(2) - (-2f32).exp() / z).abs() < 1e-5);
    assert!((prob(3) - (-1f32).exp() / z).abs() < 1e-5);

    let c = counts(&mut sampler, &l, &history, 20_000);
    assert!(c[0] * 2 < c[1], "{c:?}");
    assert!(c[2] * 2 < c[3], "{c:?}");
    // Greedy sees the penalty too.
    let mut greedy = Sampler::new(SamplingParams { temperature: 0.0, ..params }).unwrap();
    assert_eq!(greedy.sample(&l, &[0]).unwrap(), 1);
    // Only the last `repeat_last_n` tokens count.
    let mut short = Sampler::new(SamplingParams { temperature: 0.0, repeat_last_n: 1, ..params }).unwrap();
    assert_eq!(short.sample(&l, &[0, 4]).unwrap(), 0);
    assert_eq!(short.sample(&l, &[4, 0]).unwrap(), 1);
    // A token outside the vocabulary is an error, not a panic.
    assert_eq!(sampler.sample(&l, &[9]), Err(SamplingError::TokenOutOfRange { token: 9, vocab_size: 5 }));
}

#[test]
fn presence_and_frequency_penalties_subtract_per_token_and_per_occurrence() {
    // OpenAI's definition, after the repeat penalty (llama.cpp's order): a token seen c times in the window loses
    // c × frequency + presence.
    let l = [2.0f32, 2.0, -1.0, -1.0, 0.0];
    let params = SamplingParams {
        repeat_penalty: 2.0,
        repeat_last_n: 64,
        presence_penalty: 0.5,
        frequency_penalty: 0.25,
        ..plain(3)
    };
    let mut sampler = Sampler::new(params).unwrap();
    let history = [0u32, 2, 0, 0];
    let dist: Vec<_> = sampler.distribution(&l, &history).unwrap().to_vec();
    let prob = |id: u32| dist.iter().find(|t| t.id == id).unwrap().prob;
    // Token 0: 2 / 2, seen 3 times; token 2: -1 × 2, seen once.
    let want = [1.0f32 - 3.0 * 0.25 - 0.5, 2.0, -2.0 - 0.25 - 0.5, -1.0, 0.0];
    let z: f32 = want.iter().map(|v| v.exp()).sum();
    for (id, w) in want.iter().enumerate() {
        assert!((prob(id as u32) - w.exp() / z).abs() < 1e-5, "token {id}: {} vs {}", prob(id as u32), w.exp() / z);
    }
    // A negative penalty encourages repeats; the window is the same as the repeat penalty's.
    let greedy = |p: SamplingParams, h: &[u32]| Sampler::new(p).unwrap().sample(&l, h).unwrap();
    let base = SamplingParams { temperature: 0.0, ..plain(0) };
    assert_eq!(greedy(SamplingParams { repeat_last_n: 64, presence_penalty: 0.1, ..base }, &[0]), 1);
    assert_eq!(greedy(SamplingParams { repeat_last_n: 64, presence_penalty: -0.1, ..base }, &[1]), 1);
    assert_eq!(greedy(SamplingParams { repeat_last_n: 64, frequency_penalty: -2.0, ..base }, &[4, 4]), 4);
    assert_eq!(greedy(SamplingParams { repeat_last_n: 1, frequency_penalty: 2.0, ..base }, &[0, 1]), 0);
    assert_eq!(greedy(SamplingParams { repeat_last_n: 0, frequency_penalty: 2.0, ..base }, &[0, 0]), 0);
}

#[test]
fn logit_bias_adds_before_the_penalties_and_bans() {
    let l = logits(300, 7);
    let history = [5u32, 5, 9, 200];
    let params = SamplingParams {
        repeat_penalty: 1.3,
        repeat_last_n: 64,
        presence_penalty: 0.4,
        frequency_penalty: 0.2,
        top_k: 50,
        top_p: 0.9,
        min_p: 0.01,
        ..plain(11)
    };
    // The same distribution as unbiased sampling on logits with the biases added by hand (the bias comes first,
    // so the repeat penalty divides a biased logit).
    let bias = [(5u32, 2.0f32), (9, -1.5), (42, 3.0), (299, 100.0)];
    let mut biased = l.clone();
    for &(t, b) in &bias {
        biased[t as usize] += b;
    }
    let mut with = Sampler::new(params).unwrap();
    with.set_logit_bias(LogitBias::new(bias).unwrap());
    let mut by_hand = Sampler::new(params).unwrap();
    assert_eq!(with.distribution(&l, &history).unwrap(), by_hand.distribution(&biased, &history).unwrap());
    for _ in 0..50 {
        assert_eq!(with.sample(&l, &history).unwrap(), by_hand.sample(&biased, &history).unwrap());
    }

    // A ban: never drawn, even as the argmax; when every token is banned, an error.
    let top = argmax(&l);
    let mut banned = Sampler::new(SamplingParams { temperature: 0.0, ..plain(0) }).unwrap();
    banned.set_logit_bias(LogitBias::new([(top, f32::NEG_INFINITY)]).unwrap());
    assert_ne!(banned.sample(&l, &[]).unwrap(), top);
    let mut hot = Sampler::new(SamplingParams { temperature: 5.0, ..plain(1) }).unwrap();
    let few = [1.0f32, 30.0, 2.0];
    hot.set_logit_bias(LogitBias::new([(1, f32::NEG_INFINITY), (0, -100.0)]).unwrap());
    assert!((0..500).all(|_| hot.sample(&few, &[1, 1]).unwrap() == 2));
    hot.set_logit_bias(LogitBias::new((0..3).map(|t| (t, f32::NEG_INFINITY))).unwrap());
    assert_eq!(hot.sample(&few, &[]), Err(SamplingError::NothingAllowed));
    let mut mask_left_banned = Sampler::new(plain(2)).unwrap();
    mask_left_banned.set_logit_bias(LogitBias::new([(1, f32::NEG_INFINITY)]).unwrap());
    assert_eq!(mask_left_banned.sample_masked(&few, &[], &[0b010]), Err(SamplingError::NothingAllowed));
    assert_eq!(mask_left_banned.sample_masked(&few, &[], &[0b110]), Ok(2));

    // Checks: a token twice keeps its last bias; out-of-range values and tokens are refused by name.
    assert_eq!(LogitBias::new([(4, 1.0), (2, 0.5), (4, -3.0)]).unwrap().entries(), &[(2, 0.5), (4, -3.0)]);
    for b in [f32::NAN, f32::INFINITY, 100.5, -101.0] {
        assert!(matches!(LogitBias::new([(3, b)]), Err(SamplingError::InvalidBias { token: 3, .. })), "{b}");
    }
    let far = LogitBias::new([(3, 1.0), (300, 1.0)]).unwrap();
    assert_eq!(far.check_vocab(300), Err(SamplingError::BiasTokenOutOfRange { token: 300, vocab_size: 300 }));
    far.check_vocab(301).unwrap();
    let mut s = Sampler::new(plain(0)).unwrap();
    s.set_logit_bias(far);
    assert_eq!(s.sample(&l, &[]), Err(SamplingError::BiasTokenOutOfRange { token: 300, vocab_size: 300 }));
}

#[test]
fn non_finite_logits_are_an_error() {
    for params in [SamplingParams::default(), SamplingParams::GREEDY, plain(0)] {
        let mut sampler = Sampler::new(params).unwrap();
        for bad in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
            let l = [0.0, 1.0, bad, 2.0];
            assert_eq!(sampler.sample(&l, &[]), Err(SamplingError::NonFiniteLogits { index: 2 }));
            assert!(sampler.distribution(&l, &[]).is_err());
        }
        assert_eq!(sampler.sample(&[], &[]), Err(SamplingError::EmptyLogits));
    }
}

#[test]
fn extreme_logits_do_not_break_sampling() {
    let l = [f32::MAX, -f32::MAX, f32::MAX, 0.0];
    let mut sampler = Sampler::new(SamplingParams { repeat_penalty: 1e-30, ..plain(1) }).unwrap();
    for _ in 0..100 {
        let t = sampler.sample(&l, &[1, 3]).unwrap();
        assert!(t < 4);
    }
    let mut sampler = Sampler::new(SamplingParams::default()).unwrap();
    for _ in 0..100 {
        let t = sampler.sample(&l, &[]).unwrap();
        assert!(t == 0 || t == 2);
    }
}

/// Temperature-1 sampling with no filters follows the softmax: a chi-square goodness-of-fit test with a fixed seed.
#[test]
fn unfiltered_sampling_follows_softmax() {
    let l = [1.0f32, 0.5, 0.0, -0.5, -1.0, 2.0, 0.25, -2.0];
    let z: f64 = l.iter().map(|&v| f64::from(v).exp()).sum();
    let draws = 200_000;
    for seed in [1, 2, 3] {
        let mut sampler = Sampler::new(plain(seed)).unwrap();
        let c = counts(&mut sampler, &l, &[], draws);
        let chi2: f64 = l
            .iter()
            .zip(&c)
            .map(|(&v, &n)| {
                let expected = f64::from(v).exp() / z * draws as f64;
                (n as f64 - expected).powi(2) / expected
            })
            .sum();
        // 7 degrees of freedom: P(chi2 > 24.32) = 0.001.
        assert!(chi2 < 24.32, "seed {seed}: chi2 = {chi2}, counts {c:?}");
    }
    // The same through the defaults' filters at a temperature: the kept tokens' ratios still follow softmax(l / t).
    let t = 0.7f32;
    let mut sampler =
        Sampler::new(SamplingParams { temperature: t, top_k: 3, top_p: 1.0, min_p: 0.0, ..plain(9) }).unwrap();
    let c = counts(&mut sampler, &l, &[], draws);
    let kept = [5usize, 0, 1];
    let zk: f64 = kept.iter().map(|&i| f64::from(l[i] / t).exp()).sum();
    let chi2: f64 = kept
        .iter()
        .map(|&i| {
            let expected = f64::from(l[i] / t).exp() / zk * draws as f64;
            (c[i] as f64 - expected).powi(2) / expected
        })
        .sum();
    assert!(chi2 < 13.82, "chi2 = {chi2}, counts {c:?}"); // 2 dof, p = 0.001
    assert_eq!(c.iter().sum::<usize>(), kept.iter().map(|&i| c[i]).sum::<usize>());
}

#[test]
fn large_vocab_defaults_stay_in_the_nucleus() {
    let l = logits(262_144, 17);
    let mut sampler = Sampler::new(SamplingParams { seed: 3, ..Default::default() }).unwrap();
    let allowed: Vec<u32> = sampler.distribution(&l, &[]).unwrap().iter().map(|t| t.id).collect();
    assert!(allowed.len() <= 40);
    for _ in 0..200 {
        assert!(allowed.contains(&sampler.sample(&l, &[]).unwrap()));
    }
}

/// The pipeline done the slow, obvious way: a full sort, then each filter in turn. Returns the kept ids most likely
/// first and their probabilities, or `None` for greedy.
fn reference(l: &[f32], history: &[u32], p: &SamplingParams) -> (Vec<u32>, Vec<f64>) {
    let mut l = l.to_vec();
    let window = &history[history.len().saturating_sub(p.repeat_last_n)..];
    let mut seen = std::collections::BTreeMap::new();
    for &t in window {
        *seen.entry(t).or_insert(0usize) += 1;
    }
    for (&t, &count) in &seen {
        let v = &mut l[t as usize];
        *v = if *v > 0.0 { *v / p.repeat_penalty } else { *v * p.repeat_penalty };
        *v -= count as f32 * p.frequency_penalty + p.presence_penalty;
    }
    let mut order: Vec<u32> = (0..l.len() as u32).collect();
    order.sort_by(|&a, &b| l[b as usize].partial_cmp(&l[a as usize]).unwrap().then(a.cmp(&b)));
    if p.temperature == 0.0 || p.top_k == 1 {
        return (vec![order[0]], vec![1.0]);
    }
    if p.top_n_sigma > 0.0 {
        // Top-nσ: σ is the population standard deviation of every logit (measured from the max, as the sampler
        // does, so both round alike).
        let top = l[order[0] as usize];
        let d: Vec<f64> = l.iter().map(|&v| f64::from(v - top)).collect();
        let mean = d.iter().sum::<f64>() / d.len() as f64;
        let var = (d.iter().map(|x| x * x).sum::<f64>() / d.len() as f64 - mean * mean).max(0.0);
        let floor = (f64::from(top) - f64::from(p.top_n_sigma) * var.sqrt()) as f32;
        order.retain(|&i| l[i as usize] >= floor);
    }
    if p.top_k > 0 && p.top_k < order.len() {
        order.truncate(p.top_k);
    }
    if p.typical_p < 1.0 && order.len() > 1 {
        // Locally typical: rank by |surprise − entropy| (ties in logit order), keep the smallest closest set whose
        // mass reaches typical_p, in logit order again.
        let top = l[order[0] as usize];
        let w: Vec<f64> = order.iter().map(|&i| f64::from(l[i as usize] - top).exp()).collect();
        let z: f64 = w.iter().sum();
        let ln_p: Vec<f64> = order.iter().map(|&i| f64::from(l[i as usize] - top) - z.ln()).collect();
        let h: f64 = -ln_p.iter().zip(&w).map(|(lp, w)| w / z * lp).sum::<f64>();
        let mut ranked: Vec<usize> = (0..order.len()).collect();
        ranked.sort_by(|&a, &b| (-ln_p[a] - h).abs().partial_cmp(&(-ln_p[b] - h).abs()).unwrap().then(a.cmp(&b)));
        let mut keep = vec![false; order.len()];
        let mut cum = 0.0;
        for r in ranked {
            keep[r] = true;
            cum += w[r];
            if cum >= f64::from(p.typical_p) * z {
                break;
            }
        }
        let mut k = keep.iter();
        order.retain(|_| *k.next().unwrap());
    }
    let max = l[order[0] as usize];
    if p.top_p < 1.0 {
        let z: f64 = order.iter().map(|&i| f64::from(l[i as usize] - max).exp()).sum();
        let mut cum = 0.0;
        if let Some(last) = order.iter().position(|&i| {
            cum += f64::from(l[i as usize] - max).exp();
            cum >= f64::from(p.top_p) * z
        }) {
            order.truncate(last + 1);
        }
    }
    let cut = p.min_p.ln();
    order.retain(|&i| l[i as usize] - max >= cut);
    let mut t = f64::from(p.temperature);
    if p.dynatemp.range > 0.0 && order.len() > 1 {
        // Dynamic temperature: from the normalized entropy of what is left, at temperature 1.
        let w: Vec<f64> = order.iter().map(|&i| f64::from(l[i as usize] - max).exp()).collect();
        let z: f64 = w.iter().sum();
        let h: f64 = -w.iter().map(|w| w / z * (w / z).ln()).sum::<f64>();
        let (low, high) = ((t - f64::from(p.dynatemp.range)).max(0.0), t + f64::from(p.dynatemp.range));
        t = low + (high - low) * (h / (order.len() as f64).ln()).min(1.0).powf(f64::from(p.dynatemp.exponent));
    }
    if t <= 0.0 {
        return (vec![order[0]], vec![1.0]);
    }
    let w: Vec<f64> = order.iter().map(|&i| (f64::from(l[i as usize] - max) / t).exp()).collect();
    let z: f64 = w.iter().sum();
    (order, w.iter().map(|w| w / z).collect())
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(200))]
    /// Every combination of filters agrees with the slow reference (up to one token at the top-p cut, where
    /// rounding decides), and sampling only ever returns a token of the distribution.
    #[test]
    fn pipeline_matches_the_reference(
        vocab in 1usize..3000,
        salt in 0u64..1000,
        sharpness in proptest::sample::select(vec![0.1f32, 1.0, 3.0, 10.0]),
        temperature in proptest::sample::select(vec![0.0f32, 0.3, 1.0, 2.5]),
        top_k in proptest::sample::select(vec![0usize, 1, 2, 40, 100, 5000]),
        top_p in proptest::sample::select(vec![1.0f32, 0.95, 0.5, 0.05, 1e-6]),
        min_p in proptest::sample::select(vec![0.0f32, 0.05, 0.3, 1.0]),
        top_n_sigma in proptest::sample::select(vec![-1.0f32, 0.5, 1.0, 3.0]),
        typical_p in proptest::sample::select(vec![1.0f32, 1.0, 0.95, 0.5, 0.2]),
        dynatemp in proptest::sample::select(vec![(0.0f32, 1.0f32), (0.0, 1.0), (0.5, 1.0), (2.0, 2.0), (1.0, 0.5)]),
        repeat_penalty in proptest::sample::select(vec![1.0f32, 1.3, 0.7]),
        presence_penalty in proptest::sample::select(vec![0.0f32, 0.6, -1.5]),
        frequency_penalty in proptest::sample::select(vec![0.0f32, 0.3, -0.2, 2.0]),
        history in proptest::collection::vec(0u32..3000, 0..100),
    ) {
        let l: Vec<f32> = logits(vocab, salt).iter().map(|v| v * sharpness).collect();
        let history: Vec<u32> = history.into_iter().map(|t| t % vocab as u32).collect();
        let params = SamplingParams {
            temperature,
            top_k,
            top_p,
            min_p,
            top_n_sigma,
            typical_p,
            dynatemp: DynatempParams { range: dynatemp.0, exponent: dynatemp.1 },
            repeat_penalty,
            repeat_last_n: 64,
            presence_penalty,
            frequency_penalty,
            seed: salt,
            ..SamplingParams::DEFAULT
        };
        let (want, want_p) = reference(&l, &history, &params);
        let mut sampler = Sampler::new(params).unwrap();
        let dist = sampler.distribution(&l, &history).unwrap().to_vec();
        let mut got: Vec<u32> = dist.iter().map(|t| t.id).collect();
        let position: std::collections::HashMap<u32, usize> = reference_order(&l, &history, &params);
        got.sort_by_key(|id| position[id]);
        if typical_p < 1.0 {
            // Typical's cut is not at the end of the logit order: rounding at it (one token in or out, and then
            // top-p's cut on what is left) shows as a small difference between the sets.
            let differ = got.iter().filter(|t| !want.contains(t)).count() + want.iter().filter(|t| !got.contains(t)).count();
            proptest::prop_assert!(differ <= 2, "{:?} vs {:?}", got, want);
        } else {
            let n = got.len().min(want.len());
            proptest::prop_assert_eq!(&got[..n], &want[..n]);
            proptest::prop_assert!(got.len().abs_diff(want.len()) <= 1, "{} vs {} tokens", got.len(), want.len());
        }
        let total: f64 = dist.iter().map(|t| f64::from(t.prob)).sum();
        proptest::prop_assert!((total - 1.0).abs() < 1e-4);
        if got.len() == want.len() && want.iter().all(|t| got.contains(t)) {
            for (id, p) in want.iter().zip(&want_p) {
                let q = dist.iter().find(|t| t.id == *id).unwrap().prob;
                proptest::prop_assert!((f64::from(q) - p).abs() < 1e-4, "token {}: {} vs {}", id, q, p);
            }
        }
        for _ in 0..20 {
            let t = sampler.sample(&l, &history).unwrap();
            proptest::prop_assert!(got.contains(&t), "sampled {} outside the distribution", t);
        }
    }
}

/// Each token's rank in the reference's full most-likely-first order (after the penalty).
fn reference_order(l: &[f32], history: &[u32], p: &SamplingParams) -> std::collections::HashMap<u32, usize> {
    let all = SamplingParams { temperature: 1.0, top_k: 0, top_p: 1.0, min_p: 0.0, typical_p: 1.0, ..*p };
    reference(l, history, &all).0.into_iter().enumerate().map(|(rank, id)| (id, rank)).collect()
}

mod stop {
    use infer::stop::{StopError, StopMatcher, StopStep, validate_stops};
    use proptest::prelude::*;

    /// Feeds `chunks`; returns everything printed and whether (and by which stop) it stopped.
    fn run(stops: &[&str], chunks: &[&str]) -> (String, Option<usize>) {
        let mut m = StopMatcher::new(stops.iter().copied()).unwrap();
        let mut out = String::new();
        for chunk in chunks {
            match m.push(chunk) {
                StopStep::Continue(text) => out.push_str(text),
                StopStep::Stopped { text, stop } => {
                    out.push_str(text);
                    return (out, Some(stop));
                }
            }
        }
        out.push_str(m.finish());
        (out, None)
    }

    #[test]
    fn no_stops_pass_through() {
        let mut m = StopMatcher::new(Vec::<String>::new()).unwrap();
        assert_eq!(m.push("hello"), StopStep::Continue("hello"));
        assert_eq!(m.finish(), "");
    }

    #[test]
    fn stop_split_across_many_chunks() {
        assert_eq!(
            run(&["</answer>"], &["The ", "answer", " is 4", "<", "/", "ans", "wer", ">", " junk"]),
            ("The answer is 4".into(), Some(0))
        );
        // Text is held while it could be a stop string, and nothing after the stop is printed.
        let mut m = StopMatcher::new(["STOP"]).unwrap();
        assert_eq!(m.push("go S"), StopStep::Continue("go "));
        assert_eq!(m.held(), "S");
        assert_eq!(m.push("T"), StopStep::Continue(""));
        assert_eq!(m.push("O"), StopStep::Continue(""));
        assert_eq!(m.push("Pped"), StopStep::Stopped { text: "", stop: 0 });
        assert_eq!(m.push("more"), StopStep::Stopped { text: "", stop: 0 });
        assert_eq!(m.stopped(), Some(0));
        assert_eq!(m.finish(), "");
    }

    #[test]
    fn a_held_prefix_that_does_not_match_is_released() {
        let mut m = StopMatcher::new(["\n\nUser:"]).unwrap();
        assert_eq!(m.push("Hi.\n"), StopStep::Continue("Hi."));
        assert_eq!(m.push("\nUs"), StopStep::Continue(""));
        assert_eq!(m.push("ually"), StopStep::Continue("\n\nUsually"));
        assert_eq!(m.push("\n"), StopStep::Continue(""));
        assert_eq!(m.finish(), "\n", "finish flushes what is held");
        // Released in part: the tail may still start a match.
        let mut m = StopMatcher::new(["abc"]).unwrap();
        assert_eq!(m.push("ab"), StopStep::Continue(""));
        assert_eq!(m.push("ab"), StopStep::Continue("ab"));
        assert_eq!(m.push("c"), StopStep::Stopped { text: "", stop: 0 });
    }

    #[test]
    fn overlapping_and_prefix_stops() {
        // "ab" completes before "abc" could.
        assert_eq!(run(&["abc", "ab"], &["x", "a", "b", "c"]), ("x".into(), Some(1)));
        assert_eq!(run(&["abc", "ab"], &["xabc"]), ("x".into(), Some(1)));
        // The same end: the longer one wins (the earlier start).
        assert_eq!(run(&["bc", "abc"], &["xab", "c"]), ("x".into(), Some(1)));
        // Self-overlapping: "aab" fed "aaab".
        assert_eq!(run(&["aab"], &["a", "a", "a", "b"]), ("a".into(), Some(0)));
        assert_eq!(run(&["aab"], &["aaab"]), ("a".into(), Some(0)));
        assert_eq!(run(&["aab"], &["aa", "a", "a"]), ("aaaa".into(), None));
        // A later-starting stop that completes first wins, whatever the chunking.
        assert_eq!(run(&["abcd", "bc"], &["abcd"]), ("a".into(), Some(1)));
        assert_eq!(run(&["abcd", "bc"], &["a", "b", "c", "d"]), ("a".into(), Some(1)));
    }

    #[test]
    fn multibyte_text() {
        assert_eq!(run(&["终了"], &["こんにちは", "终", "了です"]), ("こんにちは".into(), Some(0)));
        assert_eq!(run(&["éé"], &["café", "!"]), ("café!".into(), None));
        assert_eq!(run(&["😀x"], &["a😀", "😀", "x"]), ("a😀".into(), Some(0)));
    }

    #[test]
    fn empty_stop_is_rejected() {
        assert_eq!(StopMatcher::new(["ok", ""]).unwrap_err(), StopError::Empty { index: 1 });
        assert_eq!(validate_stops(&[""]), Err(StopError::Empty { index: 0 }));
        assert_eq!(validate_stops(&["a", "b"]), Ok(()));
    }

    #[test]
    fn reset_and_finish_allow_reuse() {
        let mut m = StopMatcher::new(["END"]).unwrap();
        assert!(matches!(m.push("xEND"), StopStep::Stopped { .. }));
        m.reset();
        assert_eq!(m.push("yE"), StopStep::Continue("y"));
        assert_eq!(m.finish(), "E");
        assert_eq!(m.push("z"), StopStep::Continue("z"));
    }

    /// The reference: the input cut where the first stop string to complete begins (the longest one if several
    /// complete at the same place), or the whole input.
    fn reference(input: &str, stops: &[String]) -> (String, bool) {
        for (end, _) in input.char_indices().skip(1).chain(std::iter::once((input.len(), ' '))) {
            if let Some(len) = stops.iter().filter(|s| input[..end].ends_with(s.as_str())).map(String::len).max() {
                return (input[..end - len].to_string(), true);
            }
        }
        (input.to_string(), false)
    }

    fn text() -> impl Strategy<Value = String> {
        proptest::collection::vec(prop::sample::select(vec!['a', 'b', 'c', ' ', 'é', '终']), 0..40)
            .prop_map(|chars| chars.into_iter().collect())
    }

    proptest! {
        #[test]
        fn emitted_text_is_the_input_cut_at_the_first_stop(
            input in text(),
            stops in proptest::collection::vec(
                proptest::collection::vec(prop::sample::select(vec!['a', 'b', 'é']), 1..5)
                    .prop_map(|c| c.into_iter().collect::<String>()),
                0..4,
            ),
            cuts in proptest::collection::vec(0usize..64, 0..20),
        ) {
            // Split the input at char boundaries chosen by `cuts`.
            let bounds: Vec<usize> = input.char_indices().map(|(i, _)| i).chain(std::iter::once(input.len())).collect();
            let mut points: Vec<usize> = cuts.iter().map(|&c| bounds[c % bounds.len()]).collect();
            points.push(0);
            points.push(input.len());
            points.sort_unstable();
            points.dedup();
            let chunks: Vec<&str> = points.windows(2).map(|w| &input[w[0]..w[1]]).collect();

            let stop_refs: Vec<&str> = stops.iter().map(String::as_str).collect();
            let (out, stopped) = run(&stop_refs, &chunks);
            let (want, want_stopped) = reference(&input, &stops);
            prop_assert_eq!(&out, &want);
            prop_assert_eq!(stopped.is_some(), want_stopped);
            // One chunk gives the same answer as many.
            let (whole, _) = run(&stop_refs, &[&input]);
            prop_assert_eq!(whole, want);
        }
    }
}

mod args {
    use clap::Parser;
    use infer::cli::args::{SamplingArgs, StopArgs, ThreadArgs};
    use infer::sampling::SamplingParams;

    #[derive(Parser, Debug)]
    struct Cmd {
        #[command(flatten)]
        sampling: SamplingArgs,
        #[command(flatten)]
        stop: StopArgs,
        #[command(flatten)]
        threads: ThreadArgs,
    }

    fn parse(args: &[&str]) -> Result<Cmd, clap::Error> {
        Cmd::try_parse_from(std::iter::once("test").chain(args.iter().copied()))
    }

    fn err(args: &[&str]) -> String {
        parse(args).unwrap_err().to_string()
    }

    #[test]
    fn defaults_match_sampling_params() {
        let cmd = parse(&[]).unwrap();
        assert_eq!(cmd.sampling, SamplingArgs::default());
        let p = cmd.sampling.to_params();
        assert_eq!(SamplingParams { seed: 0, ..p }, SamplingParams::default());
        p.validate().unwrap();
        assert!(cmd.stop.stop.is_empty());
        assert!(cmd.threads.threads.is_none());
        assert!(cmd.threads.count() >= 1);
    }

    #[test]
    fn values_are_parsed() {
        let cmd = parse(&[
            "--temp",
            "0",
            "--top-k",
            "0",
            "--top-p",
            "1",
            "--min-p",
            "0.1",
            "--repeat-penalty",
            "1.1",
            "--repeat-last-n",
            "128",
            "--presence-penalty",
            "-0.5",
            "--frequency-penalty",
            "1.25",
            "--seed",
            "18446744073709551615",
            "-t",
            "3",
            "--stop",
            "\n\n",
            "--stop",
            "-x",
        ])
        .unwrap();
        let p = cmd.sampling.to_params();
        assert_eq!(
            p,
            SamplingParams {
                temperature: 0.0,
                top_k: 0,
                top_p: 1.0,
                min_p: 0.1,
                repeat_penalty: 1.1,
                repeat_last_n: 128,
                presence_penalty: -0.5,
                frequency_penalty: 1.25,
                seed: u64::MAX,
                ..SamplingParams::DEFAULT
            }
        );
        assert_eq!(cmd.threads.count(), 3);
        assert_eq!(cmd.stop.stop, ["\n\n", "-x"]);
        cmd.stop.matcher().unwrap();
        assert_eq!(parse(&["--threads=2"]).unwrap().threads.count(), 2);
    }

    #[test]
    fn stop_strings_understand_escapes_and_refuse_unknown_ones() {
        let stops = |arg: &str| parse(&["--stop", arg]).map(|c| c.stop.stop).map_err(|e| e.to_string());
        for (typed, meant) in [
            (r"\n\n", "\n\n"),
            (r"a\tb\r", "a\tb\r"),
            (r"\\n", "\\n"),
            (r#"\"q\'"#, "\"q'"),
            (r"\x41\x7f", "A\u{7f}"),
            (r"\u{2028}|\u{1F600}", "\u{2028}|\u{1F600}"),
            ("plain", "plain"),
            (r"é\\", "é\\"),
        ] {
            assert_eq!(stops(typed), Ok(vec![meant.to_string()]), "--stop {typed:?}");
        }
        for (typed, needle) in [
            (r"\q", "'\\q' is not an escape"),
            (r"ab\", "lone backslash"),
            (r"\xZZ", "not an ASCII escape"),
            (r"\x80", "not an ASCII escape"),
            (r"\x4", "not an ASCII escape"),
            (r"\u{110000}", "Unicode scalar"),
            (r"\u{D800}", "Unicode scalar"),
            (r"\u{}", "Unicode scalar"),
            (r"\u2028", "Unicode scalar"),
        ] {
            let message = stops(typed).unwrap_err();
            assert!(message.contains(needle), "--stop {typed:?}: {message}");
        }
    }

    #[test]
    fn explicit_seed_is_kept_and_random_seeds_differ() {
        let cmd = parse(&["--seed", "7"]).unwrap();
        assert_eq!(cmd.sampling.to_params().seed, 7);
        assert_eq!(cmd.sampling.to_params().seed, 7);
        let cmd = parse(&[]).unwrap();
        assert_ne!(cmd.sampling.to_params().seed, cmd.sampling.to_params().seed);
    }

    #[test]
    fn bad_values_are_rejected_with_a_clear_message() {
        for (args, needle) in [
            (&["--temp", "nan"][..], "not a finite number"),
            (&["--temp", "-1"], "must be >= 0"),
            (&["--temp=-0.5"], "must be >= 0"),
            (&["--temp", "inf"], "not a finite number"),
            (&["--temp", "hot"], "not a number"),
            (&["--top-p", "0"], "(0, 1]"),
            (&["--top-p", "1.5"], "(0, 1]"),
            (&["--top-p", "NaN"], "not a finite number"),
            (&["--min-p", "-0.1"], "[0, 1]"),
            (&["--min-p", "2"], "[0, 1]"),
            (&["--repeat-penalty", "0"], "> 0"),
            (&["--repeat-penalty", "-1.1"], "> 0"),
            (&["--top-k", "-1"], ">= 0"),
            (&["--top-k", "4.5"], "whole number"),
            (&["--repeat-last-n", "-64"], ">= 0"),
            (&["--presence-penalty", "2.5"], "[-2, 2]"),
            (&["--frequency-penalty=-3"], "[-2, 2]"),
            (&["--frequency-penalty", "nan"], "not a finite number"),
            (&["--seed", "-1"], "not a seed"),
            (&["-t", "0"], "at least 1"),
            (&["--threads", "-2"], "thread count"),
            (&["--stop", ""], "cannot be empty"),
        ] {
            let message = err(args);
            assert!(message.contains(needle), "{args:?}: {message}");
        }
    }

    #[test]
    fn flattening_keeps_the_commands_about() {
        use clap::CommandFactory;
        /// The parent's own text.
        #[derive(Parser, Debug)]
        struct Documented {
            #[command(flatten)]
            sampling: SamplingArgs,
            #[command(flatten)]
            threads: ThreadArgs,
        }
        let about = Documented::command().get_about().map(|a| a.to_string());
        assert_eq!(about.as_deref(), Some("The parent's own text"));
        assert!(Cmd::command().get_about().is_none());
    }

    #[test]
    fn thread_pool_has_the_requested_size() {
        let cmd = parse(&["-t", "3"]).unwrap();
        let pool = cmd.threads.build_pool().unwrap();
        assert_eq!(pool.current_num_threads(), 3);
        let n = cmd.threads.install(rayon::current_num_threads).unwrap();
        assert_eq!(n, 3);
    }
}

/// Rough per-token cost on a Gemma-sized vocabulary: `cargo test --release sampling_speed -- --ignored --nocapture`.
#[test]
#[ignore]
fn sampling_speed() {
    let l = logits(262_144, 5);
    let history: Vec<u32> = (0..64).map(|i| i * 97).collect();
    for (name, params) in [
        ("defaults", SamplingParams::default()),
        ("defaults + penalty", SamplingParams { repeat_penalty: 1.1, ..Default::default() }),
        ("greedy", SamplingParams::GREEDY),
        ("top-p 0.95 only", SamplingParams { top_k: 0, min_p: 0.0, ..Default::default() }),
        ("min-p 0.05 only", SamplingParams { top_k: 0, top_p: 1.0, ..Default::default() }),
        ("no filters", plain(0)),
    ] {
        let mut sampler = Sampler::new(params).unwrap();
        // The fastest of many runs: the least disturbed by other processes.
        let best = (0..200)
            .map(|_| {
                let start = std::time::Instant::now();
                std::hint::black_box(sampler.sample(&l, &history).unwrap());
                start.elapsed()
            })
            .min()
            .unwrap_or_default();
        eprintln!("{name:>20}: {:>8.1} µs/token", best.as_secs_f64() * 1e6);
    }
}
