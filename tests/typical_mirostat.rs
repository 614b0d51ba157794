//! Mirostat, locally typical sampling and dynamic temperature: Mirostat's feedback loop on a Zipf distribution,
//! the engine and a session drawing the same tokens with all three, and the flags and API fields being checked.
//! (Typical sampling and dynamic temperature are also checked against the slow reference in `sampling.rs`.)

use infer::engine::Request;
use infer::kernels::GgmlType;
use infer::model::KvDtype;
use infer::sampling::{DryParams, DynatempParams, MirostatParams, Sampler, SamplingParams};
use infer::session::Session;
use serde_json::{Value, json};

use crate::common::{assert_clean_failure, infer, tempdir};
use crate::engine::{config, greedy, load, run_all, session_tokens};
use crate::serve::{Server, completer, text_of, tiny_model};
use crate::synthetic::Spec;

/// Token i has probability ∝ (i + 1)^−1.1, the shape of natural text's word frequencies.
fn zipf(n: usize) -> Vec<f32> {
    (0..n).map(|i| -1.1 * ((i + 1) as f32).ln()).collect()
}

/// The surprise, in bits, of `token` under the full softmax of `logits` at temperature 1.
fn surprise(logits: &[f32], token: u32) -> f64 {
    let z: f64 = logits.iter().map(|&l| f64::from(l).exp()).sum();
    -(f64::from(logits[token as usize]).exp() / z).log2()
}

/// Mean surprise of `draws` tokens after a warm-up of 200: measured on the full distribution, and on the one each
/// token was drawn from (what Mirostat steers).
fn run(params: SamplingParams, logits: &[f32], draws: usize) -> (f64, f64) {
    let mut s = Sampler::new(params).unwrap();
    let (mut full, mut drawn) = (0.0, 0.0);
    for step in 0..200 + draws {
        let dist = s.distribution(logits, &[]).unwrap().to_vec();
        let token = s.sample(logits, &[]).unwrap();
        if step >= 200 {
            full += surprise(logits, token);
            let p = dist.iter().find(|t| t.id == token).expect("drawn from the distribution").prob;
            drawn += -f64::from(p).log2();
        }
    }
    (full / draws as f64, drawn / draws as f64)
}

#[test]
fn mirostat_steers_the_surprise_to_its_target() {
    let logits = zipf(8000);
    let plain = SamplingParams { temperature: 1.0, ..SamplingParams::GREEDY };
    let (free, _) = run(plain, &logits, 2000);
    eprintln!("free sampling at temperature 1: {free:.2} bits");
    for version in [1u8, 2] {
        let mut last = 0.0;
        for tau in [2.0f32, 3.5, 5.0] {
            let mirostat = MirostatParams { version, tau, eta: 0.1 };
            let (full, drawn) = run(SamplingParams { mirostat, seed: 7, ..plain }, &logits, 2000);
            eprintln!("mirostat {version}, tau {tau}: {drawn:.2} bits as drawn, {full:.2} on the full distribution");
            // Both versions measure what they steer: the mean error is what mu moved, over eta × draws. (On a Zipf
            // law both cut by rank, and the loop takes up version 1's ~10% bias in k: the draws come out alike.)
            assert!((drawn - f64::from(tau)).abs() < 0.15, "v{version} tau {tau}: {drawn:.3} bits");
            assert!(full > last, "a higher target gives more surprising text ({full:.2} after {last:.2})");
            last = full;
        }
        assert!(last < free, "tau 5 stays below free sampling's {free:.2} bits (got {last:.2})");
    }
    // Mirostat ignores top-k, so top-k 1 does not make it greedy, and a reseed restarts mu.
    let mirostat = MirostatParams { version: 2, tau: 3.0, eta: 0.1 };
    let mut s = Sampler::new(SamplingParams { top_k: 1, mirostat, ..plain }).unwrap();
    assert!(s.distribution(&logits, &[]).unwrap().len() > 1);
    assert_eq!(s.mirostat_mu(), 6.0);
    for _ in 0..50 {
        s.sample(&logits, &[]).unwrap();
    }
    assert_ne!(s.mirostat_mu(), 6.0);
    s.reseed(1);
    assert_eq!(s.mirostat_mu(), 6.0);
}

#[test]
fn typical_and_dynamic_temperature_shape_the_distribution() {
    // One strong favourite over a flat tail: the tail is what is typical, so typical sampling drops the favourite.
    let mut logits = vec![0.0f32; 200];
    logits[0] = 5.0;
    let params = SamplingParams { temperature: 1.0, ..SamplingParams::GREEDY };
    let mut s = Sampler::new(SamplingParams { typical_p: 0.5, ..params }).unwrap();
    let dist = s.distribution(&logits, &[]).unwrap();
    assert!(dist.iter().all(|t| t.id != 0), "the favourite is less surprising than the entropy");
    // Dynamic temperature: a sure distribution is sharpened, an unsure one flattened, around the same base.
    let dynatemp = DynatempParams { range: 0.8, exponent: 1.0 };
    let top = |logits: &[f32], p: SamplingParams| Sampler::new(p).unwrap().distribution(logits, &[]).unwrap()[0].prob;
    let sure = [4.0f32, 0.0, 0.0, 0.0];
    let unsure = [0.3f32, 0.2, 0.1, 0.0];
    assert!(top(&sure, SamplingParams { dynatemp, ..params }) > top(&sure, params));
    assert!(top(&unsure, SamplingParams { dynatemp, ..params }) < top(&unsure, params));
}

#[test]
fn the_engine_and_a_session_draw_the_same_tokens() {
    let (model, tok) = load(Spec::llama(GgmlType::Q8_0));
    // The synthetic model is sure of its next token and repeats it; DRY and a high temperature give the samplers
    // room to differ.
    let dry = DryParams { multiplier: 0.8, ..DryParams::OFF };
    let base = SamplingParams { temperature: 3.0, dry, ..SamplingParams::DEFAULT };
    let cases = [
        SamplingParams { mirostat: MirostatParams { version: 2, tau: 3.0, eta: 0.2 }, ..base },
        SamplingParams { mirostat: MirostatParams { version: 1, tau: 4.0, eta: 0.1 }, ..base },
        SamplingParams { typical_p: 0.7, ..base },
        SamplingParams { dynatemp: DynatempParams { range: 0.7, exponent: 2.0 }, ..base },
        base,
    ];
    let cases: Vec<SamplingParams> =
        cases.iter().enumerate().map(|(i, p)| SamplingParams { seed: 40 + i as u64, ..*p }).collect();
    let prompt: Vec<u32> = b"abcabcabcabc".iter().map(|&b| 3 + u32::from(b)).collect();
    let mut session = Session::new(&model, &tok, 256, KvDtype::F16);
    let mut generate = |sampling: SamplingParams| session_tokens(&mut session, &prompt, 40, sampling, None);
    let want: Vec<Vec<u32>> = cases.iter().map(|&p| generate(p)).collect();
    // Each setting acts: the same seed without it draws other tokens.
    for (case, tokens) in cases.iter().zip(&want).take(4) {
        let plain =
            SamplingParams { mirostat: MirostatParams::OFF, typical_p: 1.0, dynatemp: DynatempParams::OFF, ..*case };
        assert_ne!(&generate(plain), tokens, "{case:?}");
    }
    let reqs: Vec<Request> = cases.iter().map(|&sampling| Request { sampling, ..greedy(prompt.clone(), 40) }).collect();
    let (got, _) = run_all(&model, &tok, config(), &reqs);
    for (i, (got, want)) in got.iter().zip(&want).enumerate() {
        assert_eq!(&got.tokens, want, "case {i}");
    }
}

#[test]
fn flags_and_api_fields_are_checked() {
    let dir = tempdir();
    let model = tiny_model(dir.path());
    let m = model.to_str().unwrap();
    for (flag, value) in [
        ("--typical", "0"),
        ("--typical", "1.5"),
        ("--dynatemp-range", "-1"),
        ("--dynatemp-exp", "0"),
        ("--mirostat", "3"),
        ("--mirostat-ent", "-2"),
        ("--mirostat-lr", "nan"),
    ] {
        assert_clean_failure(&infer(&["run", m, "-p", "hi", "-n", "2", flag, value]), flag);
    }
    let ok =
        infer(&["run", m, "-p", "hi", "-n", "4", "--mirostat", "2", "--typical", "0.9", "--dynatemp-range", "0.5"]);
    assert!(ok.status.success(), "{}", String::from_utf8_lossy(&ok.stderr));

    let server = Server::start(&model, &["--ctx-size", "64"]);
    let complete = completer(&server, json!({"prompt": "hello", "max_tokens": 6, "seed": 3}));
    let sampled = |extra: Value| text_of(complete(extra));
    // Accepted, and the same seed gives the same text.
    let mirostat = json!({"mirostat": 2, "mirostat_tau": 3, "mirostat_eta": 0.2, "temperature": 1});
    assert_eq!(sampled(mirostat.clone()), sampled(mirostat));
    for (field, value) in [
        ("mirostat", json!(3)),
        ("mirostat", json!("two")),
        ("mirostat_tau", json!(-1)),
        ("mirostat_eta", json!("fast")),
        ("typical_p", json!(0)),
        ("dynatemp_range", json!(-0.5)),
        ("dynatemp_exponent", json!(0)),
    ] {
        let (status, text) = complete(json!({ field: value }));
        assert_eq!(status, 400, "{field}: {text}");
        let v: Value = serde_json::from_str(&text).unwrap();
        assert_eq!(v["error"]["param"], field, "{text}");
    }
}
