//! A whole generation on a tiny fuzzer-built model: prefill, decode, sampling, the streaming detokenizer and stop
//! strings, JSON output, DRY and XTC, speculative decoding (every proposal fed), with fuzzed weights (NaN and infinite scales included), prompt token ids (some out of range)
//! and sampling parameters. Errors are fine; a panic is not.
#![no_main]

use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use arbitrary::Arbitrary;
use infer::gguf::GgufFile;
use infer::model::{KvDtype, Model};
use infer::sampling::{DryParams, DynatempParams, LogitBias, MirostatParams, SamplerOrder, SamplingParams, XtcParams};
use infer::session::{GenerateRequest, Session};
use infer::speculative::DraftParams;
use infer::structured::OutputFormat;
use infer::tokenizer::Tokenizer;
use infer_fuzz::FuzzModel;
use libfuzzer_sys::fuzz_target;

#[derive(Arbitrary, Debug)]
struct Input {
    model: FuzzModel,
    prompt: Vec<u16>,
    n_ctx: u8,
    max_tokens: u8,
    f16_cache: bool,
    temperature: f32,
    top_k: u16,
    top_p: f32,
    min_p: f32,
    repeat_penalty: f32,
    repeat_last_n: u8,
    presence_penalty: f32,
    frequency_penalty: f32,
    dry_multiplier: f32,
    xtc_probability: f32,
    logit_bias: Vec<(u16, f32)>,
    seed: u64,
    stop: Vec<String>,
    turns: u8,
    json: bool,
    /// Most guesses per pass (`% 9`; 0 = off).
    draft: u8,
}

fuzz_target!(|input: Input| {
    let Some(bytes) = input.model.to_gguf() else { return };
    let Ok(file) = GgufFile::from_bytes(bytes) else { return };
    let Ok(model) = Model::from_file(Arc::new(file)) else { return };
    let Ok(tok) = Tokenizer::from_gguf(model.file()) else { return };
    let sampling = SamplingParams {
        temperature: input.temperature,
        top_k: input.top_k as usize,
        top_p: input.top_p,
        min_p: input.min_p,
        top_n_sigma: input.xtc_probability * 4.0 - 1.0,
        repeat_penalty: input.repeat_penalty,
        repeat_last_n: input.repeat_last_n as usize,
        presence_penalty: input.presence_penalty,
        frequency_penalty: input.frequency_penalty,
        dry: DryParams { multiplier: input.dry_multiplier, ..DryParams::OFF },
        xtc: XtcParams { probability: input.xtc_probability, ..XtcParams::OFF },
        typical_p: 1.0 - input.xtc_probability.clamp(0.0, 0.9),
        dynatemp: DynatempParams { range: input.dry_multiplier, ..DynatempParams::OFF },
        mirostat: MirostatParams { version: (input.seed % 3) as u8, ..MirostatParams::OFF },
        seed: input.seed,
        // Now and then another order of the steps (temperature first, top-k last), so generation runs the
        // one-by-one path too.
        samplers: if input.seed % 5 == 4 {
            SamplerOrder::parse("temperature;min_p;typ_p;top_p;xtc;penalties;dry;top_n_sigma;top_k").unwrap()
        } else {
            SamplerOrder::DEFAULT
        },
    };
    // DRY's breakers from the stop strings' input: none, the defaults, or those strings.
    let dry_breakers = match input.seed % 3 {
        0 => None,
        1 => Some(Vec::new()),
        _ => Some(input.stop.iter().take(3).cloned().collect()),
    };
    let logit_bias = LogitBias::new(input.logit_bias.iter().map(|&(t, b)| (u32::from(t), b))).unwrap_or_default();
    let n_ctx = 1 + input.n_ctx as usize % 64;
    let kv = if input.f16_cache { KvDtype::F16 } else { KvDtype::F32 };
    let mut session = Session::new(&model, &tok, n_ctx, kv);
    let cancel = AtomicBool::new(false);
    let mut prompt: Vec<u32> = input.prompt.iter().take(96).map(|&t| u32::from(t)).collect();
    // A second turn extends the first (a chat), so the cached prefix is reused and truncated.
    for _ in 0..=(input.turns % 3) {
        let req = GenerateRequest {
            prompt: prompt.clone(),
            max_tokens: input.max_tokens as usize % 12,
            sampling,
            stop: input.stop.iter().take(3).cloned().collect(),
            ignore_eos: input.seed % 2 == 0,
            format: if input.json { OutputFormat::JsonObject } else { OutputFormat::Text },
            logit_bias: logit_bias.clone(),
            dry_breakers: dry_breakers.clone(),
            draft: DraftParams { always: true, ..DraftParams::lookup(input.draft as usize % 9) },
        };
        let mut streamed = String::new();
        match session.generate(&req, &cancel, &mut |t| {
            streamed.push_str(t);
            Ok(())
        }) {
            Ok(g) => {
                assert_eq!(streamed, g.text);
                assert!(g.tokens.iter().all(|&t| (t as usize) < model.config.n_vocab));
                prompt.extend(g.tokens);
            }
            Err(_) => return,
        }
    }
});
