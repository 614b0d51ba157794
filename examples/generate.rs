//! Generate text through the library API, the way an embedding application would: load a model and its
//! tokenizer, open a session, stream the reply.
//!
//! ```text
//! cargo run --release --example generate -- model.gguf "The capital of France is"
//! ```

use std::io::Write;
use std::sync::atomic::AtomicBool;

use infer::model::{KvDtype, Model};
use infer::sampling::SamplingParams;
use infer::session::{GenerateRequest, Session};
use infer::tokenizer::Tokenizer;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let path = args.next().ok_or("usage: generate MODEL.gguf PROMPT")?;
    let prompt = args.next().unwrap_or_else(|| "The capital of France is".to_string());

    let model = Model::load(&path)?;
    let tokenizer = Tokenizer::from_gguf(model.file())?;
    let mut session = Session::new(&model, &tokenizer, 512, KvDtype::F16);
    let request = GenerateRequest {
        prompt: tokenizer.encode(&prompt, true, true),
        max_tokens: 32,
        sampling: SamplingParams { temperature: 0.0, ..SamplingParams::default() },
        stop: vec!["\n\n".to_string()],
        ignore_eos: false,
        format: infer::structured::OutputFormat::Text,
        logit_bias: Default::default(),
        dry_breakers: None,
        draft: infer::speculative::DraftParams::OFF,
    };
    let cancel = AtomicBool::new(false);
    let mut stdout = std::io::stdout();
    print!("{prompt}");
    let done = session.generate(&request, &cancel, &mut |text| {
        stdout.write_all(text.as_bytes())?;
        stdout.flush()
    })?;
    println!(
        "\n[{} tokens, {:.1} tokens/s, finish: {}]",
        done.tokens.len(),
        done.timings.generate_tps(),
        done.finish.as_str()
    );
    Ok(())
}
