//! The DRY and XTC samplers: what they do to a distribution (synthetic logits), that the engine and a session draw
//! the same tokens with them, that DRY ends SmolLM2's greedy loop, and that the flags and the API fields are
//! checked (top-nσ's too; its filter is tested with the others in `sampling.rs`).

use std::sync::Arc;

use infer::engine::Request;
use infer::kernels::GgmlType;
use infer::model::KvDtype;
use infer::sampling::dry::breaker_tokens;
use infer::sampling::{DryParams, Sampler, SamplingParams, XtcParams};
use infer::session::Session;
use serde_json::{Value, json};

use crate::common::{assert_clean_failure, infer, real_model, tempdir};
use crate::engine::{config, greedy, load, run_all, session_tokens};
use crate::serve::{Server, completer, text_of, tiny_model};
use crate::synthetic::Spec;

const DRY: DryParams = DryParams { multiplier: 0.8, base: 1.75, allowed_length: 2, penalty_last_n: -1 };

#[test]
fn dry_turns_greedy_away_from_a_repeat_and_a_breaker_ends_the_match() {
    // "5 6 7 8 5 6 7": 8 would make the repeat four tokens long. It leads by 0.5; DRY takes 0.8 × 1.75 = 1.4.
    let history = [5u32, 6, 7, 8, 5, 6, 7];
    let mut logits = vec![0.0f32; 16];
    logits[8] = 1.0;
    logits[9] = 0.5;
    let greedy = |dry: DryParams, breakers: Vec<u32>| {
        let mut s = Sampler::new(SamplingParams { dry, ..SamplingParams::GREEDY }).unwrap();
        s.set_dry_breakers(Arc::from(breakers));
        s.sample(&logits, &history).unwrap()
    };
    assert_eq!(greedy(DryParams::OFF, vec![]), 8);
    assert_eq!(greedy(DRY, vec![]), 9);
    // A repeat no longer than allowed_length costs nothing.
    assert_eq!(greedy(DryParams { allowed_length: 4, ..DRY }, vec![]), 8);
    // Only the last three tokens searched: "6 7" before them is out of sight.
    assert_eq!(greedy(DryParams { penalty_last_n: 3, ..DRY }, vec![]), 8);
    // 6 breaks matches: what is left of the repeat ("7") is too short.
    assert_eq!(greedy(DRY, vec![6]), 8);

    // Sampled: the repeat's token loses exactly the penalty in the distribution.
    let params = SamplingParams { temperature: 1.0, dry: DRY, ..SamplingParams::GREEDY };
    let mut s = Sampler::new(params).unwrap();
    let dist = s.distribution(&logits, &history).unwrap().to_vec();
    let p = |id: u32| dist.iter().find(|t| t.id == id).unwrap().prob;
    let want = (1.0f32 - 1.4).exp() / 0.5f32.exp();
    assert!((p(8) / p(9) - want).abs() < 1e-4, "{} vs {want}", p(8) / p(9));
}

#[test]
fn xtc_never_draws_a_top_choice_when_it_fires_and_changes_nothing_when_off() {
    // Probabilities about 0.45, 0.30, 0.15 and the rest spread thin: three top choices at a threshold of 0.1.
    let mut logits = vec![-4.0f32; 32];
    logits[0] = 2.0;
    logits[1] = 1.6;
    logits[2] = 0.9;
    let params = |xtc: XtcParams, seed: u64| SamplingParams {
        temperature: 1.0,
        top_k: 0,
        top_p: 1.0,
        min_p: 0.0,
        xtc,
        seed,
        ..SamplingParams::DEFAULT
    };
    let always = XtcParams { probability: 1.0, threshold: 0.1 };
    let mut third = 0;
    for seed in 0..300 {
        let t = Sampler::new(params(always, seed)).unwrap().sample(&logits, &[]).unwrap();
        assert!(t >= 2, "seed {seed}: drew top choice {t}");
        third += usize::from(t == 2);
    }
    // The least likely top choice stays and now leads (0.15 against 29 × 0.0027).
    assert!(third > 200, "{third}");
    // Off (probability 0, or a threshold no two tokens reach), the draws are the ones without XTC, seed for seed.
    for xtc in [XtcParams::OFF, XtcParams { probability: 1.0, threshold: 0.6 }] {
        let mut a = Sampler::new(params(XtcParams::OFF, 7)).unwrap();
        let mut b = Sampler::new(params(xtc, 7)).unwrap();
        for _ in 0..50 {
            assert_eq!(a.sample(&logits, &[]).unwrap(), b.sample(&logits, &[]).unwrap());
        }
    }
    // Greedy ignores it.
    let greedy = SamplingParams { xtc: always, ..SamplingParams::GREEDY };
    assert_eq!(Sampler::new(greedy).unwrap().sample(&logits, &[]).unwrap(), 0);
}

/// The engine resolves the same breakers and draws the same tokens as a session, request for request.
#[test]
fn the_engine_and_a_session_draw_the_same_tokens_with_dry_and_xtc() {
    let (model, tok) = load(Spec::llama(GgmlType::Q8_0));
    // The synthetic vocabulary's byte tokens are 3..259: "\n" is token 13, and ';' shows custom breakers work.
    assert!(breaker_tokens(&tok, &["\n"]).contains(&13));
    assert_eq!(breaker_tokens(&tok, &[";"]), [3 + u32::from(b';')]);
    let cases: Vec<(SamplingParams, Option<Vec<String>>)> = (0..6u64)
        .map(|i| {
            let sampling = SamplingParams {
                temperature: 1.2,
                dry: DryParams { multiplier: 0.5 + i as f32, ..DRY },
                xtc: XtcParams { probability: [0.0, 0.5, 1.0][i as usize % 3], threshold: 0.05 },
                seed: i,
                ..SamplingParams::DEFAULT
            };
            let breakers =
                [None, Some(vec![";".to_string(), "e".to_string()]), Some(Vec::new())][i as usize % 3].clone();
            (sampling, breakers)
        })
        .collect();
    let prompt: Vec<u32> = b"abcabcabcabc".iter().map(|&b| 3 + u32::from(b)).collect();
    let mut session = Session::new(&model, &tok, 256, KvDtype::F16);
    let mut generate = |sampling: &SamplingParams, breakers: &Option<Vec<String>>| {
        session_tokens(&mut session, &prompt, 40, *sampling, breakers.clone())
    };
    let want: Vec<Vec<u32>> = cases.iter().map(|(sampling, breakers)| generate(sampling, breakers)).collect();
    // DRY acts: without it the first case (XTC off there) draws other tokens from the same seed.
    let (first, _) = &cases[0];
    assert_ne!(generate(&SamplingParams { dry: DryParams::OFF, ..*first }, &None), want[0]);
    let reqs: Vec<Request> = cases
        .iter()
        .map(|(sampling, breakers)| Request {
            sampling: *sampling,
            dry_breakers: breakers.clone(),
            ..greedy(prompt.clone(), 40)
        })
        .collect();
    let (got, _) = run_all(&model, &tok, config(), &reqs);
    for (i, (got, want)) in got.iter().zip(&want).enumerate() {
        assert_eq!(&got.tokens, want, "case {i}");
    }
    // The settings reach the sampler on both paths: the six cases do not all draw alike.
    assert!(want.windows(2).any(|w| w[0] != w[1]));
}

/// SmolLM2 at temperature 0 falls into a loop of whole lines on this prompt; DRY takes it out of the loop.
#[test]
fn dry_ends_smollm2s_greedy_loop() {
    let Some(path) = real_model("smollm2") else { return };
    let p = path.to_str().unwrap();
    let poem = |extra: &[&str]| {
        let mut args = vec!["run", p, "--chat", "-p", "Write a poem about the sea.", "--temp", "0", "-n", "200"];
        args.extend_from_slice(extra);
        args.extend_from_slice(&["-t", "2"]);
        let out = infer(&args);
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8(out.stdout).unwrap()
    };
    // Lines that repeat an earlier line word for word, over all non-empty lines.
    let repeated = |text: &str| {
        let lines: Vec<&str> = text.lines().map(str::trim).filter(|l| !l.is_empty()).collect();
        let dupes = lines.iter().enumerate().filter(|(i, l)| lines[..*i].contains(l)).count();
        (dupes as f64 / lines.len().max(1) as f64, lines.len())
    };
    let (plain, n_plain) = repeated(&poem(&[]));
    let (dry, n_dry) = repeated(&poem(&["--dry-multiplier", "0.8"]));
    assert!(plain > 0.5, "without DRY the greedy poem should loop: {plain:.2} of {n_plain} lines repeat");
    assert!(dry < 0.25, "with DRY {dry:.2} of {n_dry} lines repeat (without: {plain:.2})");
    // With every token a breaker ("e" and " " are in nearly all of them), DRY finds no repeats: the loop is back.
    let (broken, _) =
        repeated(&poem(&["--dry-multiplier", "0.8", "--dry-sequence-breaker", "e", "--dry-sequence-breaker", " "]));
    assert!(broken > 0.3, "{broken:.2}");
}

#[test]
fn flags_and_api_fields_are_checked() {
    let dir = tempdir();
    let model = tiny_model(dir.path());
    let m = model.to_str().unwrap();
    for (flag, value, needle) in [
        ("--dry-multiplier", "-1", "--dry-multiplier"),
        ("--dry-base", "0.5", "--dry-base"),
        ("--dry-penalty-last-n", "-2", "--dry-penalty-last-n"),
        ("--dry-allowed-length", "x", "--dry-allowed-length"),
        ("--dry-sequence-breaker", "", "--dry-sequence-breaker"),
        ("--xtc-probability", "1.5", "--xtc-probability"),
        ("--xtc-threshold", "nan", "--xtc-threshold"),
        ("--top-n-sigma", "inf", "--top-n-sigma"),
    ] {
        assert_clean_failure(&infer(&["run", m, "-p", "hi", "-n", "2", flag, value]), needle);
    }
    let both = ["--dry-sequence-breaker", "none", "--dry-sequence-breaker", "x"];
    let mut args = vec!["run", m, "-p", "hi", "-n", "2"];
    args.extend_from_slice(&both);
    assert_clean_failure(&infer(&args), "none");
    // Accepted on the command line (chat's /set is checked in the unit tests of cli::chat::commands).
    let ok = infer(&["run", m, "-p", "hi", "-n", "4", "--dry-multiplier", "0.8", "--xtc-probability", "0.5"]);
    assert!(ok.status.success(), "{}", String::from_utf8_lossy(&ok.stderr));

    // The API: llama-server's field names; a bad value is a 400 naming the field.
    let server = Server::start(&model, &["--ctx-size", "64"]);
    let complete =
        completer(&server, json!({"prompt": "hello", "max_tokens": 8, "temperature": 0, "logit_bias": {"40": 20}}));
    // The bias makes one token the argmax at every step; a steep DRY stops the run of it.
    let plain = text_of(complete(json!({})));
    assert_eq!(plain, plain[..1].repeat(8), "{plain:?}");
    let dry = text_of(complete(json!({"dry_multiplier": 5, "dry_base": 4, "dry_allowed_length": 1})));
    assert_ne!(dry, plain);
    // Breakers that include that token's text: no match, the run is back.
    let broken = text_of(complete(json!({"dry_multiplier": 5, "dry_base": 4, "dry_allowed_length": 1,
                                         "dry_sequence_breakers": [&plain[..1]]})));
    assert_eq!(broken, plain);
    assert_eq!(text_of(complete(json!({"xtc_probability": 1, "xtc_threshold": 0.1}))), plain, "greedy ignores XTC");
    assert_eq!(text_of(complete(json!({"top_n_sigma": 1.0}))), plain, "the argmax passes top-nσ");
    for (field, value) in [
        ("dry_multiplier", json!(-1)),
        ("dry_base", json!(0.5)),
        ("dry_allowed_length", json!(-1)),
        ("dry_penalty_last_n", json!(-5)),
        ("dry_sequence_breakers", json!([""])),
        ("dry_sequence_breakers", json!([1])),
        ("dry_sequence_breakers", json!(vec!["x"; 40])),
        ("xtc_probability", json!(2)),
        ("xtc_threshold", json!("high")),
        ("top_n_sigma", json!("wide")),
    ] {
        let (status, text) = complete(json!({ field: value }));
        assert_eq!(status, 400, "{field}: {text}");
        let v: Value = serde_json::from_str(&text).unwrap();
        assert_eq!(v["error"]["param"], field, "{text}");
    }
}
