//! Model construction from a parsed file: hyper-parameters against tensor shapes, missing and extra tensors,
//! vocabulary and special-token ids out of range, the chat template. A fuzzer-built [`FuzzModel`] is loaded as
//! `infer` loads a model; every outcome but a panic (or a timeout, or too much memory) is fine.
#![no_main]

use std::sync::Arc;

use infer::gguf::GgufFile;
use infer::model::Model;
use infer::tokenizer::{ChatMessage, ChatTemplate, Tokenizer};
use infer_fuzz::FuzzModel;
use libfuzzer_sys::fuzz_target;

#[global_allocator]
static ALLOC: infer::kernels::budget::BudgetAlloc = infer::kernels::budget::BudgetAlloc;

fuzz_target!(|m: FuzzModel| {
    let Some(bytes) = m.to_gguf() else { return };
    let Ok(file) = GgufFile::from_bytes(bytes) else { return };
    let file = Arc::new(file);
    let model = Model::from_file(file.clone());
    let tok = Tokenizer::from_gguf(&file);
    if let (Ok(model), Ok(tok)) = (&model, &tok) {
        // Whatever the tokenizer emits must be a token the model has, or the forward pass refuses it.
        let ids = tok.encode("<|im_start|>user\nhello world ☃<|im_end|>", true, true);
        assert!(ids.iter().all(|&i| (i as usize) < tok.n_vocab()));
        let _ = model.config.n_vocab;
    }
    let limits = infer::tokenizer::chat::RenderLimits { memory: 16 << 20, time: std::time::Duration::from_millis(500) };
    if let Ok(t) = ChatTemplate::from_gguf(&file, None) {
        let _ = t.with_limits(limits).render(&[ChatMessage::new("user", "hi")], true);
    }
    // `infer doctor` on the same file, metadata checks only (the `forward` target runs models): a report, never a
    // panic. Its template renders get a quarter of the limits each (it renders up to five times).
    let quarter = infer::tokenizer::chat::RenderLimits { memory: limits.memory, time: limits.time / 4 };
    let opts = infer::doctor::Options { render_limits: Some(quarter), ..Default::default() };
    let report = infer::doctor::examine(&file, &opts, &std::sync::atomic::AtomicBool::new(false));
    assert!(!report.checks.is_empty());
});
