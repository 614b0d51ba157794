//! Calibration: run the model over a text and keep, for every weight matrix, the mean square of each input column
//! (llama-imatrix's statistic), so that the quantizer spends its precision on the columns whose inputs are large.
//! llama.cpp does this with a separate tool and an imatrix file; here it is a step of `infer quantize`.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};

use crate::eval::{EvalError, Runner};
use crate::model::Model;
use crate::tokenizer::Tokenizer;

/// Per GGUF tensor name, one importance value per column: the mean square of the input that column multiplies.
#[derive(Debug, Clone, Default)]
pub struct Importance {
    by_tensor: HashMap<String, Vec<f32>>,
    /// Tokens the statistics were gathered over.
    pub tokens: usize,
}

impl Importance {
    pub fn get(&self, tensor: &str) -> Option<&Vec<f32>> {
        self.by_tensor.get(tensor)
    }

    /// How many tensors have an importance vector.
    pub fn len(&self) -> usize {
        self.by_tensor.len()
    }

    pub fn is_empty(&self) -> bool {
        self.by_tensor.is_empty()
    }
}

/// Runs `model` over `text` in chunks of `n_ctx` tokens (each from an empty cache, starting with BOS if the model
/// adds one; a shorter text is one chunk) and gathers the importance of every matrix's columns, at most
/// `max_chunks` chunks. `on_chunk(done, total)` hears of progress.
pub fn calibrate(
    model: &Model,
    tokenizer: &Tokenizer,
    text: &str,
    n_ctx: usize,
    max_chunks: Option<usize>,
    cancel: &AtomicBool,
    on_chunk: &mut dyn FnMut(usize, usize),
) -> Result<Importance, EvalError> {
    let tokens = tokenizer.encode(text, false, false);
    if tokens.is_empty() {
        return Err(EvalError::TooFewTokens { have: 0, need: 1, n_ctx });
    }
    let body = n_ctx.saturating_sub(1).max(1);
    let bos = tokenizer.add_bos().then(|| tokenizer.bos()).flatten();
    let chunks: Vec<&[u32]> = tokens.chunks(body).take(max_chunks.unwrap_or(usize::MAX)).collect();
    let mut runner = Runner::new(model, n_ctx);
    runner.scratch_mut().collect_stats(model);
    let mut seq = Vec::with_capacity(n_ctx);
    for (i, chunk) in chunks.iter().enumerate() {
        if cancel.load(Ordering::Relaxed) {
            return Err(EvalError::Cancelled);
        }
        seq.clear();
        seq.extend(bos);
        seq.extend_from_slice(chunk);
        // Every position's logits, so the output projection's input is counted at every token as the others are.
        runner.run_chunk(&seq, 0, |_, _| {})?;
        on_chunk(i + 1, chunks.len());
    }
    let stats = runner.scratch_mut().take_stats().expect("collect_stats was called above");
    let tied = model.file().tensor_info("output.weight").is_none();
    let mut by_tensor = HashMap::new();
    for info in model.file().tensors() {
        if let Some(mut mean) = stats.for_tensor(&info.name, tied).and_then(|s| s.mean_sq())
            && mean.len() as u64 == info.ne0()
        {
            // A column the text never excited still holds weights: keep a floor under its importance.
            let floor = 1e-4 * mean.iter().sum::<f32>() / mean.len() as f32;
            mean.iter_mut().for_each(|v| *v = v.max(floor));
            by_tensor.insert(info.name.clone(), mean);
        }
    }
    Ok(Importance { by_tensor, tokens: chunks.iter().map(|c| c.len()).sum() })
}
