//! Tokenizer tests on the real models: token-exact agreement with the reference tokenizations, round trips, the
//! streaming decoder, end-of-generation tokens, chat templates and `infer tokenize`.

use std::io::Write;
use std::process::Stdio;
use std::sync::OnceLock;

use infer::gguf::GgufFile;
use infer::tokenizer::{ChatMessage, ChatTemplate, Tokenizer};
use proptest::prelude::*;

use crate::common;

struct Loaded {
    path: std::path::PathBuf,
    file: GgufFile,
    tok: Tokenizer,
}

fn load(name: &str) -> Option<&'static Loaded> {
    static SMOL: OnceLock<Option<Loaded>> = OnceLock::new();
    static GEMMA: OnceLock<Option<Loaded>> = OnceLock::new();
    let cell = match name {
        "smollm2" => &SMOL,
        "gemma3" => &GEMMA,
        other => panic!("unknown model {other}"),
    };
    cell.get_or_init(|| {
        let path = common::real_model(name)?;
        let file = GgufFile::open(&path).expect("open model");
        let tok = Tokenizer::from_gguf(&file).expect("build tokenizer");
        Some(Loaded { path, file, tok })
    })
    .as_ref()
}

/// Every line of a reference file: (text, ids).
fn reference_lines(file: &str) -> Vec<(String, Vec<u32>)> {
    let text = std::fs::read_to_string(common::reference(file)).expect("read reference file");
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).expect("reference line is JSON");
            let t = v["text"].as_str().expect("text").to_string();
            let ids = v["ids"].as_array().expect("ids").iter().map(|x| x.as_u64().expect("id") as u32).collect();
            (t, ids)
        })
        .collect()
}

fn check_reference(model: &str, file: &str) {
    let Some(m) = load(model) else { return };
    let lines = reference_lines(file);
    assert!(lines.len() >= 50, "{file}: only {} lines", lines.len());
    let mut bad = Vec::new();
    for (text, want) in &lines {
        let got = m.tok.encode(text, false, true);
        if &got != want {
            bad.push(format!("{text:?}\n   want {want:?}\n   got  {got:?}"));
        }
    }
    assert!(bad.is_empty(), "{model}: {} of {} lines differ:\n{}", bad.len(), lines.len(), bad.join("\n"));
}

#[test]
fn smollm2_matches_reference_tokenization() {
    check_reference("smollm2", "smollm2-tokenize.jsonl");
}

#[test]
fn gemma3_matches_reference_tokenization() {
    check_reference("gemma3", "gemma3-tokenize.jsonl");
}
