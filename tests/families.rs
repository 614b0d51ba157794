//! The model families against Hugging Face transformers: tiny random-weight models built by
//! `tests/data/families/make.py` from transformers' own classes, converted by llama.cpp's converter, with
//! transformers' f32 logits and greedy continuations beside them. Every weight is F32 and the KV cache is f32, so
//! the only differences left are summation order.

use std::path::PathBuf;

use infer::gguf::{GgufFile, GgufWriter};
use infer::model::{ForwardScratch, KvDtype, KvPool, Logits, Model, SeqKv, SeqStep};

use crate::common::{assert_clean_failure, infer, infer_bin};

const FAMILIES: [&str; 6] = ["qwen2", "qwen3", "llama", "phi3", "gemma2", "qwen3moe"];
const MAX_ABS_DELTA: f32 = 1e-3;

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data/families").join(name)
}

struct Expected {
    n_vocab: usize,
    sequences: Vec<Vec<u32>>,
    logits: Vec<Vec<Vec<f32>>>,
    greedy_prompt: Vec<u32>,
    greedy: Vec<u32>,
}

fn expected(family: &str) -> Expected {
    let text = std::fs::read_to_string(fixture(&format!("{family}.json"))).expect("fixture json");
    let v: serde_json::Value = serde_json::from_str(&text).expect("fixture json parses");
    let ids = |v: &serde_json::Value| -> Vec<u32> {
        v.as_array().expect("array").iter().map(|x| x.as_u64().expect("id") as u32).collect()
    };
    Expected {
        n_vocab: v["n_vocab"].as_u64().expect("n_vocab") as usize,
        sequences: v["sequences"].as_array().expect("sequences").iter().map(ids).collect(),
        logits: serde_json::from_value(v["logits"].clone()).expect("logits"),
        greedy_prompt: ids(&v["greedy_prompt"]),
        greedy: ids(&v["greedy"]),
    }
}

fn argmax(row: &[f32]) -> usize {
    (0..row.len()).fold(0, |best, i| if row[i] > row[best] { i } else { best })
}

/// `infer logits` on each family's fixture, every logit of every position against transformers'.
#[test]
fn logits_match_transformers() {
    for family in FAMILIES {
        let e = expected(family);
        let stdin: String = e.sequences.iter().map(|s| format!("{s:?}\n")).collect();
        let gguf = fixture(&format!("{family}.gguf"));
        let k = e.n_vocab.to_string();
        let mut child = infer_bin()
            .args(["logits", gguf.to_str().unwrap(), "--top-k", &k, "--kv-type", "f32"])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("spawn infer");
        use std::io::Write;
        child.stdin.take().unwrap().write_all(stdin.as_bytes()).unwrap();
        let out = child.wait_with_output().unwrap();
        assert!(out.status.success(), "{family}: {}", String::from_utf8_lossy(&out.stderr));
        let lines: Vec<&str> = std::str::from_utf8(&out.stdout).unwrap().lines().collect();
        assert_eq!(lines.len(), e.sequences.len(), "{family}: one line per sequence");
        let (mut max_delta, mut agree, mut positions) = (0f32, 0, 0);
        for (line, want) in lines.iter().zip(&e.logits) {
            let v: serde_json::Value = serde_json::from_str(line).unwrap();
            let top: Vec<Vec<(u32, f32)>> = serde_json::from_value(v["top"].clone()).unwrap();
            assert_eq!(top.len(), want.len(), "{family}: positions");
            for (got, want) in top.iter().zip(want) {
                assert_eq!(got.len(), e.n_vocab, "{family}: every logit printed");
                let mut row = vec![f32::NAN; e.n_vocab];
                for &(id, l) in got {
                    row[id as usize] = l;
                }
                for (a, b) in row.iter().zip(want) {
                    let d = (a - b).abs();
                    assert!(!d.is_nan(), "{family}: a logit is missing or NaN");
                    max_delta = max_delta.max(d);
                }
                agree += usize::from(got[0].0 as usize == argmax(want));
                positions += 1;
            }
        }
        // The child runs the same kernel level as this process: both read INFER_ISA, or pick the CPU's best.
        let isa = infer::kernels::dispatch::isa().name();
        eprintln!("{family} ({isa}): {positions} positions, max |Δ| {max_delta:.2e}, top-1 {agree}/{positions}");
        assert!(max_delta <= MAX_ABS_DELTA, "{family}: max |Δ| {max_delta} > {MAX_ABS_DELTA}");
        assert_eq!(agree, positions, "{family}: top-1 agreement");
    }
}

/// 32 greedy tokens through the library: the prompt in one pass, then one token per pass from the f32 cache.
#[test]
fn greedy_matches_transformers() {
    for family in FAMILIES {
        let e = expected(family);
        let model = Model::load(fixture(&format!("{family}.gguf"))).expect("fixture loads");
        let n = e.greedy_prompt.len() + e.greedy.len();
        let mut pool = KvPool::new(&model.config, KvDtype::F32, n, n);
        let mut kv = SeqKv::new();
        let mut scratch = ForwardScratch::new(&model);
        let mut next = e.greedy_prompt.clone();
        let mut got = Vec::new();
        while got.len() < e.greedy.len() {
            let mut items = [SeqStep { tokens: &next, kv: &mut kv, logits: Logits::Last }];
            model.forward(&mut items, &mut pool, &mut scratch).expect("forward");
            let t = argmax(scratch.logits(0, model.config.n_vocab)) as u32;
            got.push(t);
            next = vec![t];
        }
        assert_eq!(got, e.greedy, "{family}: greedy continuation");
    }
}

/// A copy of a fixture with one tensor dropped or one added (and metadata edited), at `path`.
fn rewrite(family: &str, path: &std::path::Path, drop: Option<&str>, add: Option<&str>, meta: &[(&str, &str)]) {
    let file = GgufFile::open(fixture(&format!("{family}.gguf"))).unwrap();
    let mut w = GgufWriter::new();
    w.copy_metadata(file.metadata());
    for (k, v) in meta {
        w.set_str(k, v);
    }
    for t in file.tensors().iter().filter(|t| Some(t.name.as_str()) != drop) {
        w.add_tensor(&t.name, &t.dims, t.ty, file.tensor_data(t).to_vec()).unwrap();
    }
    if let Some(name) = add {
        w.add_f32(name, &[64], &[0.0; 64]).unwrap();
    }
    w.write_file(path).unwrap();
}

#[test]
fn unknown_or_missing_tensors_are_refused_by_name() {
    let dir = crate::common::tempdir();
    // (family, a tensor it lacks that a variant would bring, a tensor it needs)
    let cases = [
        ("qwen2", "blk.0.attn_q_norm.weight", "blk.1.attn_v.bias"),
        ("qwen3", "blk.0.attn_q.bias", "blk.0.attn_k_norm.weight"),
        ("llama", "blk.1.attn_q.bias", "blk.1.ffn_gate.weight"),
        ("phi3", "rope_factors_long.weight", "blk.0.attn_qkv.weight"),
        ("gemma2", "blk.0.attn_q_norm.weight", "blk.2.post_ffw_norm.weight"),
        ("qwen3moe", "blk.0.ffn_gate_shexp.weight", "blk.1.ffn_down_exps.weight"),
    ];
    for (family, extra, needed) in cases {
        let path = dir.path().join(format!("{family}-extra.gguf"));
        rewrite(family, &path, None, Some(extra), &[]);
        let out = infer(&["logits", path.to_str().unwrap()]);
        assert_clean_failure(&out, &format!("tensor '{extra}' is not used by the {family} decoder"));
        let path = dir.path().join(format!("{family}-missing.gguf"));
        rewrite(family, &path, Some(needed), None, &[]);
        let out = infer(&["logits", path.to_str().unwrap()]);
        assert_clean_failure(&out, &format!("no tensor named '{needed}'"));
    }
}

#[test]
fn unknown_rope_scaling_is_refused_by_name() {
    let dir = crate::common::tempdir();
    let path = dir.path().join("yarn.gguf");
    rewrite("qwen2", &path, None, None, &[("qwen2.rope.scaling.type", "yarn")]);
    let out = infer(&["logits", path.to_str().unwrap()]);
    assert_clean_failure(&out, "qwen2.rope.scaling.type");
    assert_clean_failure(&out, "yarn");
}

/// The bytes of one expert's three matrices, from the file's 3-D tensors (all layers alike in the fixture).
fn expert_bytes(model: &Model) -> u64 {
    let n_expert = model.config.moe.expect("an expert model").n_expert as u64;
    ["gate", "up", "down"]
        .iter()
        .map(|m| model.file().tensor_info(&format!("blk.0.ffn_{m}_exps.weight")).expect("expert tensor").n_bytes)
        .sum::<u64>()
        / n_expert
}

/// Decoding one token reads only its 2 chosen experts of 8 per layer, once each: a quarter of the expert bytes.
/// Decoding 16 sequences in one batch reads each chosen expert once per layer (32 choices, at most 8 reads), and
/// gives each sequence the logits it gets alone.
#[test]
fn experts_are_read_only_when_chosen_and_once_per_step() {
    let model = Model::load(fixture("qwen3moe.gguf")).expect("fixture loads");
    let (c, m) = (&model.config, model.config.moe.unwrap());
    assert_eq!((m.n_expert, m.n_used), (8, 2));
    let per_expert = expert_bytes(&model);
    let all_experts = per_expert * (m.n_expert * c.n_layer) as u64;
    let prompts: Vec<Vec<u32>> = (0..16u32).map(|i| (0..5).map(|j| 4 + (i * 37 + j * 11) % 300).collect()).collect();
    let mut pool = KvPool::new(c, KvDtype::F32, 32 * 16, 32 * 16);
    let mut scratch = ForwardScratch::new(&model);
    // Each sequence alone: its prompt, then one decode step.
    let mut alone = Vec::new();
    for (i, p) in prompts.iter().enumerate() {
        let mut kv = SeqKv::new();
        let mut items = [SeqStep { tokens: &p[..4], kv: &mut kv, logits: Logits::None }];
        model.forward(&mut items, &mut pool, &mut scratch).unwrap();
        let mut items = [SeqStep { tokens: &p[4..], kv: &mut kv, logits: Logits::Last }];
        model.forward(&mut items, &mut pool, &mut scratch).unwrap();
        alone.push(scratch.logits(0, c.n_vocab).to_vec());
        pool.release(&mut kv);
        if i > 0 {
            continue;
        }
        let reads = scratch.expert_reads();
        for l in 0..c.n_layer {
            let layer = &reads[l * m.n_expert..(l + 1) * m.n_expert];
            assert!(layer.iter().all(|&r| r <= 1), "layer {l}: {layer:?}");
            assert_eq!(layer.iter().sum::<u32>() as usize, m.n_used, "layer {l}: {layer:?}");
        }
        let touched: u64 = reads.iter().map(|&r| u64::from(r) * per_expert).sum();
        let share = touched as f64 / all_experts as f64;
        eprintln!("one token: {touched} of {all_experts} expert bytes read ({share:.2})");
        assert_eq!(touched * 4, all_experts);
    }
    let mut kvs: Vec<SeqKv> = (0..16).map(|_| SeqKv::new()).collect();
    for (p, kv) in prompts.iter().zip(&mut kvs) {
        let mut items = [SeqStep { tokens: &p[..4], kv, logits: Logits::None }];
        model.forward(&mut items, &mut pool, &mut scratch).unwrap();
    }
    // All 16 together.
    let mut items: Vec<SeqStep> =
        prompts.iter().zip(&mut kvs).map(|(p, kv)| SeqStep { tokens: &p[4..], kv, logits: Logits::Last }).collect();
    model.forward(&mut items, &mut pool, &mut scratch).unwrap();
    let reads = scratch.expert_reads();
    for l in 0..c.n_layer {
        let layer = &reads[l * m.n_expert..(l + 1) * m.n_expert];
        assert!(layer.iter().all(|&r| r <= 1), "layer {l}: an expert read more than once: {layer:?}");
        assert!(layer.iter().sum::<u32>() as usize >= m.n_used, "layer {l}: {layer:?}");
    }
    eprintln!("16 sequences: expert reads per layer {reads:?} (16 tokens × top-2 = 32 choices per layer)");
    for (i, want) in alone.iter().enumerate() {
        let got = scratch.logits(i, c.n_vocab);
        let d = got.iter().zip(want).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
        assert!(d <= 1e-4, "sequence {i}: batched logits differ from its own by {d}");
    }
}

/// The SentencePiece flavour Llama and Phi-3 GGUFs carry (`tokenizer.ggml.model = llama`, a space prefix, scores
/// as merge ranks): the fixtures' vocabulary encodes as the sentencepiece library itself encodes it.
#[test]
fn spm_vocabulary_encodes_as_sentencepiece() {
    let text = std::fs::read_to_string(fixture("spm-tokenize.jsonl")).expect("spm-tokenize.jsonl");
    for family in ["llama", "phi3"] {
        let model = Model::load(fixture(&format!("{family}.gguf"))).unwrap();
        let tok = infer::tokenizer::Tokenizer::from_gguf(model.file()).expect("the fixture's tokenizer loads");
        let mut n = 0;
        for line in text.lines() {
            let v: serde_json::Value = serde_json::from_str(line).unwrap();
            let want: Vec<u32> = serde_json::from_value(v["ids"].clone()).unwrap();
            let t = v["text"].as_str().unwrap();
            assert_eq!(tok.encode(t, false, false), want, "{family}: {t:?}");
            n += 1;
        }
        assert!(n >= 8, "{family}: {n} cases");
    }
}
