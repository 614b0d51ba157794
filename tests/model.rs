//! The decoder: the KV cache adds no error, batching changes nothing, and real models stay close to f32.

use std::sync::Arc;

use infer::gguf::GgufFile;
use infer::kernels::GgmlType;
use infer::model::{ForwardScratch, KvDtype, KvPool, Logits, Model, SeqKv, SeqStep};

use crate::common::real_model;
use crate::synthetic::{Rng, Spec, build};

fn load_synthetic(spec: Spec) -> Model {
    let bytes = build(spec, 7).to_bytes().unwrap();
    Model::from_file(Arc::new(GgufFile::from_bytes(bytes).unwrap())).unwrap()
}

/// Last-position logits after running `tokens` in chunks of `chunk` (1 = token-by-token decode).
fn last_logits(model: &Model, tokens: &[u32], chunk: usize, kv_dtype: KvDtype) -> Vec<f32> {
    let c = &model.config;
    let mut pool = KvPool::new(c, kv_dtype, tokens.len() + 16, tokens.len() + 16);
    let mut kv = SeqKv::new();
    let mut scratch = ForwardScratch::new(model);
    for part in tokens.chunks(chunk) {
        let mut items = [SeqStep { tokens: part, kv: &mut kv, logits: Logits::Last }];
        model.forward(&mut items, &mut pool, &mut scratch).unwrap();
    }
    scratch.logits(0, c.n_vocab).to_vec()
}

fn max_rel_diff(a: &[f32], b: &[f32]) -> f32 {
    let scale = a.iter().map(|v| v.abs()).fold(0f32, f32::max).max(1e-6);
    a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0f32, f32::max) / scale
}

/// The KV element types `model` can have: the 8-bit cache needs heads of whole blocks of 32 (the synthetic llama's
/// heads of 16 cannot; the gemma spec's and a llama with `head_dim: 32` can).
fn kv_dtypes(model: &Model) -> Vec<KvDtype> {
    let mut all = vec![KvDtype::F32, KvDtype::F16];
    if model.config.head_dim.is_multiple_of(32) {
        assert!(KvDtype::Q8_0.check(&model.config).is_ok());
        all.push(KvDtype::Q8_0);
    } else {
        assert!(KvDtype::Q8_0.check(&model.config).is_err(), "heads of {} accepted", model.config.head_dim);
    }
    all
}

fn random_tokens(n: usize, n_vocab: usize, seed: u64) -> Vec<u32> {
    let mut rng = Rng::new(seed);
    (0..n).map(|_| (rng.next_u64() % n_vocab as u64) as u32).collect()
}

#[test]
fn prefill_equals_token_by_token_decode_on_synthetic_models() {
    for spec in [
        Spec::llama(GgmlType::Q4_1),
        Spec::llama(GgmlType::Q8_0),
        Spec::llama(GgmlType::F32),
        Spec::gemma(GgmlType::Q5_0),
        Spec { head_dim: 32, ..Spec::llama(GgmlType::Q4_0) },
    ] {
        let model = load_synthetic(spec);
        // Longer than the gemma spec's sliding window (8) and than a KV block (16), so both are crossed.
        let tokens = random_tokens(37, spec.n_vocab, 3);
        for kv in kv_dtypes(&model) {
            let prefill = last_logits(&model, &tokens, tokens.len(), kv);
            let decode = last_logits(&model, &tokens, 1, kv);
            let mixed = last_logits(&model, &tokens, 5, kv);
            assert!(prefill.iter().all(|v| v.is_finite()));
            let d1 = max_rel_diff(&prefill, &decode);
            let d2 = max_rel_diff(&prefill, &mixed);
            assert!(
                d1 < 1e-4 && d2 < 1e-4,
                "{:?} {:?}: prefill vs decode {d1}, vs chunks of 5 {d2}",
                spec.weight_type,
                kv
            );
        }
    }
}

#[test]
fn batching_sequences_changes_nothing() {
    let spec = Spec::gemma(GgmlType::Q4_1);
    let model = load_synthetic(spec);
    let c = &model.config;
    let a = random_tokens(20, spec.n_vocab, 11);
    let b = random_tokens(9, spec.n_vocab, 12);
    let alone_a = last_logits(&model, &a, a.len(), KvDtype::F32);
    let alone_b = last_logits(&model, &b, b.len(), KvDtype::F32);
    let mut pool = KvPool::new(c, KvDtype::F32, 64, 64);
    let (mut kva, mut kvb) = (SeqKv::new(), SeqKv::new());
    let mut scratch = ForwardScratch::new(&model);
    // Prefill both in one batch, then decode one more token each, together.
    let mut items = [
        SeqStep { tokens: &a[..19], kv: &mut kva, logits: Logits::None },
        SeqStep { tokens: &b[..8], kv: &mut kvb, logits: Logits::None },
    ];
    model.forward(&mut items, &mut pool, &mut scratch).unwrap();
    let mut items = [
        SeqStep { tokens: &a[19..], kv: &mut kva, logits: Logits::Last },
        SeqStep { tokens: &b[8..], kv: &mut kvb, logits: Logits::Last },
    ];
    model.forward(&mut items, &mut pool, &mut scratch).unwrap();
    assert!(max_rel_diff(&alone_a, scratch.logits(0, c.n_vocab)) < 1e-4);
    assert!(max_rel_diff(&alone_b, scratch.logits(1, c.n_vocab)) < 1e-4);
}

/// Enough sequences decoding together that attention takes whole tokens per task and quantizes the output
/// projection's input rows itself (with two threads, 8 or more tokens): every sequence's logits must equal, bit for
/// bit, those it gets decoding alone, where attention splits by head and the projection quantizes its own input.
#[test]
fn many_sequences_decode_bit_for_bit_as_alone() {
    decode_alone_and_batched(|i| 3 + 4 * i);
}

/// The same with caches of 250 to 610 positions, across the boundaries of attention's 256-position spans: alone,
/// a decoding token's spans are tasks of their own, merged afterwards; in a batch, one task merges them in turn.
#[test]
fn long_caches_decode_bit_for_bit_as_alone() {
    decode_alone_and_batched(|i| 250 + 40 * i);
}

/// A token decoding alone over a cache with enough spans for the threads takes every query head per task, over all
/// the key heads at once (two contiguous runs per block); with more threads than that feeds, it splits the heads
/// by key head (3 threads: 10 tasks) or, when even that leaves threads without a task, one by one (16 threads: 20
/// tasks). All three must give the same logits, bit for bit.
#[test]
fn decode_tasks_over_all_key_heads_match_tasks_per_key_head() {
    for spec in [Spec::llama(GgmlType::Q4_1), Spec { head_dim: 32, ..Spec::llama(GgmlType::Q4_1) }] {
        decode_tasks_agree(spec);
    }
}

fn decode_tasks_agree(spec: Spec) {
    let model = load_synthetic(spec);
    // Five 256-position spans.
    let tokens = random_tokens(1100, spec.n_vocab, 21);
    for kv_dtype in kv_dtypes(&model) {
        let on = |threads: usize| {
            let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().unwrap();
            pool.install(|| last_logits(&model, &tokens, tokens.len() - 1, kv_dtype))
        };
        let all_heads = on(2);
        assert!(all_heads.iter().all(|v| v.is_finite()));
        for threads in [3, 16] {
            let split = on(threads);
            assert!(
                all_heads.iter().zip(&split).all(|(a, b)| a.to_bits() == b.to_bits()),
                "{kv_dtype:?}: {threads} threads differ from 2 (max rel {})",
                max_rel_diff(&all_heads, &split)
            );
        }
    }
}

fn decode_alone_and_batched(len: fn(usize) -> usize) {
    let threads = rayon::ThreadPoolBuilder::new().num_threads(2).build().unwrap();
    threads.install(|| {
        for spec in [Spec::llama(GgmlType::Q4_1), Spec::gemma(GgmlType::Q8_0)] {
            let model = load_synthetic(spec);
            let c = &model.config;
            let seqs: Vec<Vec<u32>> = (0..10).map(|i| random_tokens(len(i), spec.n_vocab, 100 + i as u64)).collect();
            for kv_dtype in kv_dtypes(&model) {
                let alone: Vec<Vec<f32>> = seqs.iter().map(|s| last_logits(&model, s, s.len() - 1, kv_dtype)).collect();
                let mut pool = KvPool::new(c, kv_dtype, 8192, 8192);
                let mut kvs: Vec<SeqKv> = seqs.iter().map(|_| SeqKv::new()).collect();
                let mut scratch = ForwardScratch::new(&model);
                for (s, kv) in seqs.iter().zip(kvs.iter_mut()) {
                    let mut items = [SeqStep { tokens: &s[..s.len() - 1], kv, logits: Logits::None }];
                    model.forward(&mut items, &mut pool, &mut scratch).unwrap();
                }
                let mut items: Vec<SeqStep> = seqs
                    .iter()
                    .zip(kvs.iter_mut())
                    .map(|(s, kv)| SeqStep { tokens: &s[s.len() - 1..], kv, logits: Logits::Last })
                    .collect();
                model.forward(&mut items, &mut pool, &mut scratch).unwrap();
                for (i, want) in alone.iter().enumerate() {
                    let got = scratch.logits(i, c.n_vocab);
                    assert!(
                        got.iter().zip(want).all(|(a, b)| a.to_bits() == b.to_bits()),
                        "{:?} {kv_dtype:?}: sequence {i} differs in a batch of 10 (max rel {})",
                        spec.weight_type,
                        max_rel_diff(want, got)
                    );
                }
            }
        }
    });
}

#[test]
fn invalid_tokens_and_full_cache_are_errors() {
    let model = load_synthetic(Spec::llama(GgmlType::Q8_0));
    let c = &model.config;
    let mut pool = KvPool::new(c, KvDtype::F16, 16, 16);
    let mut kv = SeqKv::new();
    let mut scratch = ForwardScratch::new(&model);
    let bad = [c.n_vocab as u32];
    let mut items = [SeqStep { tokens: &bad, kv: &mut kv, logits: Logits::Last }];
    let e = model.forward(&mut items, &mut pool, &mut scratch).unwrap_err();
    assert!(e.to_string().contains("out of range"), "{e}");
    let many = vec![5u32; 17];
    let mut items = [SeqStep { tokens: &many, kv: &mut kv, logits: Logits::Last }];
    let e = model.forward(&mut items, &mut pool, &mut scratch).unwrap_err();
    assert!(e.to_string().contains("KV cache is full"), "{e}");
}

#[test]
fn real_model_prefill_equals_decode() {
    let Some(path) = real_model("smollm2") else { return };
    let model = Model::load(path).unwrap();
    let tokens: Vec<u32> = vec![504, 28899, 3102, 40652, 6351, 30, 42136, 13768, 2422, 281, 351, 260, 17662, 28, 284];
    let prefill = last_logits(&model, &tokens, tokens.len(), KvDtype::F32);
    let decode = last_logits(&model, &tokens, 1, KvDtype::F32);
    let d = max_rel_diff(&prefill, &decode);
    assert!(d < 1e-4, "prefill vs decode on SmolLM2: {d}");
}

/// The SIMD levels the fidelity tests run `infer logits` on: `INFER_ISA` if it is set, else every vector level this
/// CPU has (each has kernels of its own, so each must hold the same fidelity).
fn simd_levels() -> Vec<String> {
    match std::env::var("INFER_ISA") {
        Ok(isa) if !isa.trim().is_empty() => vec![isa],
        _ => infer::kernels::dispatch::Isa::available()
            .into_iter()
            .filter(|i| *i != infer::kernels::dispatch::Isa::Scalar)
            .map(|i| i.name().to_string())
            .collect(),
    }
}

/// Runs `infer logits` (at SIMD level `isa`) on a reference file's sequences and scores the result the way
/// `score_logits.py` does: top-1 agreement with f32, and mean |Δlogit| over the reference's top-10 ids.
fn score_against_f32(model: &str, fixture: &str, isa: &str) -> Option<(f64, f64)> {
    score_against_f32_with(model, fixture, isa, "f16")
}

/// [`score_against_f32`] with the KV cache in `kv_type`.
fn score_against_f32_with(model: &str, fixture: &str, isa: &str, kv_type: &str) -> Option<(f64, f64)> {
    let path = real_model(model)?;
    let fixture = crate::common::reference_text(fixture)?;
    let lines: Vec<serde_json::Value> = fixture.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    let mut input = String::new();
    for l in &lines {
        let mut ids: Vec<u64> = l["prompt_ids"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap()).collect();
        ids.extend(l["continuation_ids"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap()));
        input.push_str(&serde_json::to_string(&ids).unwrap());
        input.push('\n');
    }
    let mut child = crate::common::infer_bin()
        .args(["logits", path.to_str().unwrap(), "--top-k", "40", "--kv-type", kv_type])
        .env("INFER_ISA", isa)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::Write;
    child.stdin.take().unwrap().write_all(input.as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let got: Vec<serde_json::Value> =
        String::from_utf8(out.stdout).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(got.len(), lines.len(), "one output line per sequence");
    let (mut agree, mut total, mut delta_sum, mut n_delta) = (0usize, 0usize, 0f64, 0usize);
    for (f, c) in lines.iter().zip(&got) {
        let refs = f["top10"].as_array().unwrap();
        let tops = c["top"].as_array().unwrap();
        assert_eq!(refs.len(), tops.len(), "one entry per position");
        for (r, t) in refs.iter().zip(tops) {
            let t = t.as_array().unwrap();
            total += 1;
            if r[0][0] == t[0][0] {
                agree += 1;
            }
            for pair in r.as_array().unwrap() {
                let id = pair[0].as_u64().unwrap();
                if let Some(hit) = t.iter().find(|p| p[0].as_u64() == Some(id)) {
                    delta_sum += (hit[1].as_f64().unwrap() - pair[1].as_f64().unwrap()).abs();
                    n_delta += 1;
                }
            }
        }
    }
    Some((agree as f64 / total as f64, delta_sum / n_delta as f64))
}

#[test]
fn smollm2_logits_stay_close_to_f32() {
    for isa in simd_levels() {
        let Some((top1, mean)) = score_against_f32("smollm2", "smollm2-logits-f32.jsonl", &isa) else { return };
        eprintln!("SmolLM2 vs f32 ({isa}): top-1 {top1:.4}, mean |Δ| {mean:.4} (llama.cpp: 0.973, 0.169)");
        // The issue asks for ≥ 0.97 and ≤ 0.20; we hold ourselves to far tighter bounds than llama.cpp reaches.
        assert!(top1 >= 0.99 && mean <= 0.02, "{isa}: top-1 {top1}, mean |Δ| {mean}");
    }
}

#[test]
fn gemma3_logits_stay_close_to_f32() {
    for isa in simd_levels() {
        let Some((top1, mean)) = score_against_f32("gemma3", "gemma3-logits-f32.jsonl", &isa) else { return };
        eprintln!("Gemma 3 vs f32 ({isa}): top-1 {top1:.4}, mean |Δ| {mean:.4} (llama.cpp: 0.957, 0.199)");
        assert!(top1 >= 0.99 && mean <= 0.02, "{isa}: top-1 {top1}, mean |Δ| {mean}");
    }
}

/// The 8-bit KV cache (`--kv-type q8_0`) on both real models: each key and value rounded to 8 bits in blocks of 32
/// moves the logits further from f32 than the f16 cache does (mean |Δ| 0.002 → 0.075 on SmolLM2, 0.0014 → 0.052 on
/// Gemma 3, top-1 0.993 and 0.992; AVX2, 2026-12-05), but stays well inside llama.cpp's own distance from f32
/// with its f16 cache (0.169, 0.199). The bounds leave room above those figures.
#[test]
fn q8_kv_cache_logits_stay_close_to_f32() {
    for (model, fixture, name) in
        [("smollm2", "smollm2-logits-f32.jsonl", "SmolLM2"), ("gemma3", "gemma3-logits-f32.jsonl", "Gemma 3")]
    {
        for isa in simd_levels() {
            let Some((top1, mean)) = score_against_f32_with(model, fixture, &isa, "q8_0") else { return };
            eprintln!("{name} with a q8_0 KV cache vs f32 ({isa}): top-1 {top1:.4}, mean |Δ| {mean:.4}");
            assert!(top1 >= 0.98 && mean <= 0.10, "{name} {isa}: top-1 {top1}, mean |Δ| {mean}");
        }
    }
}

#[test]
fn sliding_window_layers_keep_a_bounded_cache() {
    // gemma-style: 5 of 6 layers slide over a window of 8 positions.
    let spec = Spec::gemma(GgmlType::Q8_0);
    let model = load_synthetic(spec);
    let c = &model.config;
    let tokens = random_tokens(100, spec.n_vocab, 21);
    let run = |swa_capacity: usize| {
        let mut pool = KvPool::new(c, KvDtype::F32, 128, swa_capacity);
        let mut kv = SeqKv::new();
        let mut scratch = ForwardScratch::new(&model);
        for t in &tokens {
            let step = [*t];
            let mut items = [SeqStep { tokens: &step, kv: &mut kv, logits: Logits::Last }];
            model.forward(&mut items, &mut pool, &mut scratch).unwrap();
        }
        (scratch.logits(0, c.n_vocab).to_vec(), pool.bytes())
    };
    // Room for two 16-position blocks in the sliding layers is enough for 100 positions: blocks that leave the
    // window are recycled. The result equals a run whose sliding layers could have kept everything.
    let (bounded, small_bytes) = run(32);
    let (unbounded, big_bytes) = run(128);
    assert!(small_bytes < big_bytes);
    assert!(max_rel_diff(&bounded, &unbounded) < 1e-6);
}

/// Runs `parts` one forward pass each through a fresh sequence in `pool`, returning the last logits.
fn run_parts(model: &Model, pool: &mut KvPool, kv: &mut SeqKv, parts: &[&[u32]]) -> Vec<f32> {
    let mut scratch = ForwardScratch::new(model);
    for part in parts {
        let mut items = [SeqStep { tokens: part, kv: &mut *kv, logits: Logits::Last }];
        model.forward(&mut items, pool, &mut scratch).unwrap();
    }
    scratch.logits(0, model.config.n_vocab).to_vec()
}

#[test]
fn sliding_window_pool_takes_batches_that_start_inside_a_block() {
    // A pool sized for the window plus one batch of 16 must take 16-token batches at any offset, including those
    // that straddle one block more than 16 positions fill (it ran out of blocks when its size ignored that).
    let spec = Spec::gemma(GgmlType::Q8_0);
    let model = load_synthetic(spec);
    let c = &model.config;
    let window = c.sliding_window.unwrap();
    let tokens = random_tokens(120, spec.n_vocab, 31);
    let mut parts: Vec<&[u32]> = vec![&tokens[..5]];
    parts.extend(tokens[5..].chunks(16));
    let mut pool = KvPool::new(c, KvDtype::F32, 128, window + 16);
    let bounded = run_parts(&model, &mut pool, &mut SeqKv::new(), &parts);
    let mut big = KvPool::new(c, KvDtype::F32, 128, 128);
    let unbounded = run_parts(&model, &mut big, &mut SeqKv::new(), &parts);
    assert!(max_rel_diff(&bounded, &unbounded) < 1e-6);
}

#[test]
fn sliding_window_truncation_needs_the_window_and_the_rewind_margin_keeps_it() {
    let spec = Spec::gemma(GgmlType::Q8_0);
    let model = load_synthetic(spec);
    let c = &model.config;
    let window = c.sliding_window.unwrap();
    let tokens = random_tokens(100, spec.n_vocab, 41);
    let more = random_tokens(10, spec.n_vocab, 42);
    let one_by_one: Vec<&[u32]> = tokens.chunks(1).collect();

    // Without a margin, going back even 20 positions reaches blocks that left the window and were freed.
    let mut pool = KvPool::new(c, KvDtype::F32, 128, window + 1);
    let mut kv = SeqKv::new();
    run_parts(&model, &mut pool, &mut kv, &one_by_one);
    assert!(pool.can_truncate(&kv, 100) && pool.can_truncate(&kv, 99));
    assert!(!pool.can_truncate(&kv, 80), "blocks before position {} are gone", 100 - window);

    // With a margin of 24 they are kept: truncating to 80 and going on equals a sequence that never went further;
    // 60 is beyond the margin.
    let mut pool = KvPool::with_rewind(c, KvDtype::F32, 128, window + 1, 24);
    let mut kv = SeqKv::new();
    run_parts(&model, &mut pool, &mut kv, &one_by_one);
    assert!(pool.can_truncate(&kv, 80));
    assert!(!pool.can_truncate(&kv, 60));
    assert!(!pool.can_truncate(&kv, 101), "cannot truncate forwards");
    pool.truncate(&mut kv, 80);
    let rewound = run_parts(&model, &mut pool, &mut kv, &[&more]);
    let mut fresh_pool = KvPool::new(c, KvDtype::F32, 128, 128);
    let fresh = run_parts(&model, &mut fresh_pool, &mut SeqKv::new(), &[&tokens[..80], &more]);
    assert!(max_rel_diff(&rewound, &fresh) < 1e-4);
}
