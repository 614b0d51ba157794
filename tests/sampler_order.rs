//! The order of the sampling steps (`--samplers`, `--sampling-seq`, the server's `samplers`): the one-by-one path
//! against the fused one where the orders mean the same, against hand-computed distributions where they do not,
//! and the flags and fields that set it.

use std::sync::Arc;

use infer::sampling::{DryParams, DynatempParams, Sampler, SamplerOrder, SamplingParams, XtcParams};

use crate::common::infer;
use crate::sampling::logits;

/// The distribution as (id, probability), sorted by id.
fn dist(params: SamplingParams, logits: &[f32], history: &[u32]) -> Vec<(u32, f32)> {
    let mut s = Sampler::new(params).unwrap();
    s.set_dry_breakers(Arc::from([]));
    let mut d: Vec<(u32, f32)> = s.distribution(logits, history).unwrap().iter().map(|t| (t.id, t.prob)).collect();
    d.sort_by_key(|t| t.0);
    d
}

fn same(a: &[(u32, f32)], b: &[(u32, f32)], what: &str) {
    assert_eq!(a.iter().map(|t| t.0).collect::<Vec<_>>(), b.iter().map(|t| t.0).collect::<Vec<_>>(), "{what}");
    for (x, y) in a.iter().zip(b) {
        assert!((x.1 - y.1).abs() < 2e-5, "{what}: token {} {} vs {}", x.0, x.1, y.1);
    }
}

/// Every step but XTC in the default order runs one by one (a different order value, so not the fused path); with
/// XTC off that is the same sampling, so the distributions agree over many settings.
#[test]
fn the_one_by_one_path_agrees_with_the_fused_one_in_the_default_order() {
    let no_xtc = SamplerOrder::parse("penalties;dry;top_n_sigma;top_k;typ_p;top_p;min_p;temperature").unwrap();
    assert!(!no_xtc.is_default());
    let mut checked = 0;
    for round in 0..400u64 {
        let n = [7, 64, 300, 2000][round as usize % 4];
        let l = logits(n, round);
        let history: Vec<u32> = (0..20).map(|i| ((i * 7 + round) % n as u64) as u32).collect();
        let params = SamplingParams {
            temperature: [0.0, 0.5, 1.0, 1.7][(round / 4 % 4) as usize],
            top_k: [0, 1, 5, 40][(round / 16 % 4) as usize],
            top_p: [1.0, 0.9, 0.5][(round / 64 % 3) as usize],
            min_p: [0.0, 0.05, 0.2][(round / 3 % 3) as usize],
            typical_p: [1.0, 0.7][(round / 5 % 2) as usize],
            top_n_sigma: [-1.0, 1.0, 2.5][(round / 7 % 3) as usize],
            repeat_penalty: [1.0, 1.3][(round / 11 % 2) as usize],
            presence_penalty: [0.0, 0.5][(round / 13 % 2) as usize],
            dry: if round % 17 == 0 { DryParams { multiplier: 0.8, ..DryParams::OFF } } else { DryParams::OFF },
            dynatemp: if round % 19 == 0 { DynatempParams { range: 0.5, exponent: 1.0 } } else { DynatempParams::OFF },
            seed: round,
            ..SamplingParams::DEFAULT
        };
        let fused = dist(params, &l, &history);
        let ordered = dist(SamplingParams { samplers: no_xtc, ..params }, &l, &history);
        same(&fused, &ordered, &format!("round {round}: {params:?}"));
        checked += fused.len();
    }
    assert!(checked > 1000);
}

fn softmax(l: &[f32], t: f32) -> Vec<f64> {
    let max = l.iter().fold(f32::MIN, |m, &v| m.max(v));
    let w: Vec<f64> = l.iter().map(|&v| f64::from((v - max) / t).exp()).collect();
    let z: f64 = w.iter().sum();
    w.iter().map(|x| x / z).collect()
}

/// The smallest most-likely-first set whose mass reaches `p`, as ids sorted.
fn nucleus(probs: &[f64], p: f64) -> Vec<u32> {
    let mut order: Vec<u32> = (0..probs.len() as u32).collect();
    order.sort_by(|&a, &b| probs[b as usize].total_cmp(&probs[a as usize]).then(a.cmp(&b)));
    let mut cum = 0.0;
    let mut kept = Vec::new();
    for id in order {
        kept.push(id);
        cum += probs[id as usize];
        if cum >= p * (1.0 - 1e-12) {
            break;
        }
    }
    kept.sort();
    kept
}

#[test]
fn the_temperature_before_top_p_changes_what_top_p_keeps() {
    let l = logits(200, 5);
    let base = SamplingParams { temperature: 2.0, top_k: 0, top_p: 0.5, min_p: 0.0, ..SamplingParams::DEFAULT };
    // Default (temperature last): top-p on the temperature-1 distribution, then the draw at 2.
    let late = dist(base, &l, &[]);
    let want_late = nucleus(&softmax(&l, 1.0), 0.5);
    assert_eq!(late.iter().map(|t| t.0).collect::<Vec<_>>(), want_late);
    // Temperature first: top-p measures the flatter distribution, so it keeps more.
    let early = dist(SamplingParams { samplers: SamplerOrder::parse("temperature;top_p").unwrap(), ..base }, &l, &[]);
    let flat = softmax(&l, 2.0);
    let want_early = nucleus(&flat, 0.5);
    assert_eq!(early.iter().map(|t| t.0).collect::<Vec<_>>(), want_early);
    assert!(want_early.len() > want_late.len());
    // Its probabilities are the flat ones renormalized over what it kept.
    let mass: f64 = want_early.iter().map(|&i| flat[i as usize]).sum();
    for &(id, p) in &early {
        assert!((f64::from(p) - flat[id as usize] / mass).abs() < 1e-5);
    }
}

#[test]
fn a_step_left_out_does_not_run() {
    let l = logits(100, 9);
    let history = [3u32, 3, 3, 4];
    let base = SamplingParams {
        temperature: 0.7,
        top_k: 5,
        top_p: 0.9,
        min_p: 0.1,
        repeat_penalty: 1.5,
        ..SamplingParams::DEFAULT
    };
    // Without the temperature: the draw is at temperature 1 over what top-k left.
    let only_k = SamplerOrder::parse("top_k").unwrap();
    let d = dist(SamplingParams { samplers: only_k, ..base }, &l, &history);
    assert_eq!(d.len(), 5);
    let mut top: Vec<u32> = (0..100).collect();
    top.sort_by(|&a, &b| l[b as usize].total_cmp(&l[a as usize]));
    top.truncate(5);
    let sub: Vec<f32> = top.iter().map(|&i| l[i as usize]).collect();
    let want = softmax(&sub, 1.0);
    for (i, &id) in top.iter().enumerate() {
        let got = d.iter().find(|t| t.0 == id).unwrap().1;
        assert!((f64::from(got) - want[i]).abs() < 1e-5, "token {id}");
    }
    // An empty order: the whole distribution at temperature 1, no penalty.
    let none = SamplerOrder::parse("").unwrap();
    let d = dist(SamplingParams { samplers: none, ..base }, &l, &history);
    let want = softmax(&l, 1.0);
    assert_eq!(d.len(), 100);
    for &(id, p) in &d {
        assert!((f64::from(p) - want[id as usize]).abs() < 1e-5);
    }
    // Greedy stays greedy in any order: the most likely token after the listed steps, and top-k 1 only counts
    // where top-k is listed.
    let greedy = SamplingParams { temperature: 0.0, ..base };
    let best = |order: &str, history: &[u32]| {
        let p = SamplingParams { samplers: SamplerOrder::parse(order).unwrap(), ..greedy };
        Sampler::new(p).unwrap().sample(&l, history).unwrap()
    };
    assert_eq!(best("top_k;temperature", &history), top[0]);
    assert!(!SamplingParams { top_k: 1, temperature: 1.0, samplers: none, ..base }.is_greedy());
    assert!(SamplingParams { top_k: 1, temperature: 1.0, samplers: only_k, ..base }.is_greedy());
    // The penalty listed: it moves the argmax off a token the history repeats.
    let mut peaked = l.clone();
    peaked[3] = 10.0;
    peaked[4] = 9.0;
    let p = SamplingParams { samplers: SamplerOrder::parse("penalties").unwrap(), ..greedy };
    assert_eq!(Sampler::new(p).unwrap().sample(&peaked, &[3, 3]).unwrap(), 4);
    let p = SamplingParams { samplers: SamplerOrder::parse("top_k").unwrap(), ..greedy };
    assert_eq!(Sampler::new(p).unwrap().sample(&peaked, &[3, 3]).unwrap(), 3);
}

#[test]
fn xtc_where_it_stands_and_a_mask() {
    // XTC before top-k: it removes the top choices of the whole distribution, and top-k keeps the next ones.
    let mut l = vec![-4.0f32; 32];
    l[0] = 2.0;
    l[1] = 1.6;
    l[2] = 0.9;
    let params = SamplingParams {
        temperature: 1.0,
        top_k: 2,
        top_p: 1.0,
        min_p: 0.0,
        xtc: XtcParams { probability: 1.0, threshold: 0.1 },
        samplers: SamplerOrder::parse("xtc;top_k;temperature").unwrap(),
        ..SamplingParams::DEFAULT
    };
    let mut s = Sampler::new(params).unwrap();
    for _ in 0..50 {
        let id = s.sample(&l, &[]).unwrap();
        assert!(id >= 2, "{id}");
    }
    // A mask chooses the first candidates.
    let mask = [0b1010_0000u64];
    let mut s = Sampler::new(SamplingParams { samplers: SamplerOrder::parse("top_k").unwrap(), ..params }).unwrap();
    for _ in 0..50 {
        let id = s.sample_masked(&l, &[], &mask).unwrap();
        assert!(id == 5 || id == 7, "{id}");
    }
}

#[test]
fn orders_parse_print_and_refuse_by_name() {
    let d = SamplerOrder::DEFAULT;
    assert_eq!(d.to_string(), "penalties;dry;top_n_sigma;top_k;typ_p;top_p;min_p;xtc;temperature");
    assert_eq!(SamplerOrder::parse(&d.to_string()).unwrap(), d);
    assert_eq!(SamplerOrder::parse_letters("edskypmxt").unwrap(), d);
    assert_eq!(SamplerOrder::parse("top-k, Temperature").unwrap().to_string(), "top_k;temperature");
    assert_eq!(SamplerOrder::parse("typical;nucleus;temp").unwrap().to_string(), "typ_p;top_p;temperature");
    for (text, needle) in [("top_k;foo", "unknown sampler `foo`"), ("top_k;top-k", "`top_k` is listed twice")] {
        let e = SamplerOrder::parse(text).unwrap_err();
        assert!(e.contains(needle), "{text}: {e}");
    }
    assert!(SamplerOrder::parse_letters("kq").unwrap_err().contains("unknown sampler letter `q`"));
    let json = serde_json::to_string(&SamplingParams::DEFAULT).unwrap();
    assert!(json.contains(r#""samplers":"penalties;dry;top_n_sigma;top_k;typ_p;top_p;min_p;xtc;temperature""#));
    let back: SamplingParams = serde_json::from_str(&json.replace("penalties;dry;", "")).unwrap();
    assert_eq!(back.samplers.to_string(), "top_n_sigma;top_k;typ_p;top_p;min_p;xtc;temperature");
}

#[test]
fn the_flags_and_the_server_field_set_the_order() {
    let dir = crate::common::tempdir();
    let model = crate::serve::tiny_model(dir.path());
    let m = model.to_str().unwrap();
    // Greedy with the order given, and a bad one refused before the model loads.
    let run = |extra: &[&str]| {
        let mut args = vec!["run", m, "-p", "hello", "-n", "8", "--temp", "0"];
        args.extend(extra);
        infer(&args)
    };
    let plain = run(&[]);
    assert!(plain.status.success());
    let ordered = run(&["--samplers", "top_k;temperature"]);
    assert!(ordered.status.success(), "{}", String::from_utf8_lossy(&ordered.stderr));
    assert_eq!(ordered.stdout, plain.stdout, "greedy text does not depend on the filters");
    assert!(run(&["--sampling-seq", "kt"]).status.success());
    for (args, needle) in [
        (vec!["--samplers", "top_k;bogus"], "unknown sampler `bogus`"),
        (vec!["--sampling-seq", "kz"], "unknown sampler letter `z`"),
        (vec!["--samplers", "top_k", "--sampling-seq", "k"], "cannot be used with"),
    ] {
        let out = run(&args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains(needle), "{args:?}: {err}");
    }

    use crate::serve::{Server, post};
    let server = Server::start(&model, &["--ctx-size", "128"]);
    let url = format!("{}/v1/completions", server.base);
    for samplers in [r#"["top_k", "temperature"]"#, r#""top_k;temperature""#, "null"] {
        let body = format!(r#"{{"prompt": "hi", "max_tokens": 4, "samplers": {samplers}, "seed": 1}}"#);
        let (status, _, text) = post(&url, body.as_bytes());
        assert_eq!(status, 200, "{body}: {text}");
    }
    for (samplers, needle) in [
        (r#"["top_k", "bogus"]"#, "unknown sampler `bogus`"),
        (r#"["top_k;temperature"]"#, "is not one sampler name"),
        (r#"[1]"#, "expected sampler names, found a number"),
        ("7", "expected a list of sampler names or a string, not a number"),
    ] {
        let body = format!(r#"{{"prompt": "hi", "samplers": {samplers}}}"#);
        let (status, _, text) = post(&url, body.as_bytes());
        assert_eq!(status, 400, "{body}: {text}");
        let v: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(v["error"]["param"], "samplers", "{text}");
        assert!(v["error"]["message"].as_str().unwrap().contains(needle), "{body}: {text}");
    }
}
