//! Chat-template rendering with a fuzzed template and fuzzed messages, under small render limits: any template
//! renders, or fails with an error (syntax, exception, instruction, recursion, output, memory or time limit).
//!
//! The input is raw bytes, so that real templates seed the corpus as they are (scripts/fuzz.sh extracts the
//! registry models' ones): the template, then, after each NUL byte, the BOS text, the EOS text and the messages'
//! role/content pairs. The first byte after the template's NUL, if any, also says whether to add the generation
//! prompt.
#![no_main]

use std::time::Duration;

use infer::tokenizer::chat::{ChatMessage, ChatTemplate, RenderLimits};
use libfuzzer_sys::fuzz_target;

#[global_allocator]
static ALLOC: infer::kernels::budget::BudgetAlloc = infer::kernels::budget::BudgetAlloc;

fuzz_target!(|data: &[u8]| {
    let mut parts = data.split(|&b| b == 0).map(|p| String::from_utf8_lossy(p).into_owned());
    let template = parts.next().unwrap_or_default();
    let bos = parts.next().unwrap_or_else(|| "<s>".to_string());
    let add_generation_prompt = !bos.len().is_multiple_of(2);
    let eos = parts.next().unwrap_or_else(|| "</s>".to_string());
    let mut messages = Vec::new();
    while let (Some(role), Some(content)) = (parts.next(), parts.next()) {
        messages.push(ChatMessage::new(role, content));
        if messages.len() == 16 {
            break;
        }
    }
    if messages.is_empty() {
        messages = vec![ChatMessage::new("system", "Be brief."), ChatMessage::new("user", "Hi ☃")];
    }
    let Ok(t) = ChatTemplate::new("fuzz", template, bos, eos) else { return };
    // Small limits: libFuzzer counts a second per input as a hang, and a render that passes its memory limit leaves
    // that much behind for good (see infer_kernels::budget).
    let t = t.with_limits(RenderLimits { memory: 8 << 20, time: Duration::from_millis(300) });
    let _ = t.render(&messages, add_generation_prompt);
});
