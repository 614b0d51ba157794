//! The check after quantizing: how far the output's next-token predictions are from the input's on one text
//! (`infer quantize --check`, `--max-kld`), so that a bad conversion is caught where it is made rather than by
//! the people who later use the file.

use crate::eval::{DivergenceReport, EvalError, compare_continuation, tokenize_text};
use crate::model::{KvDtype, Model};
use crate::tokenizer::Tokenizer;

/// A text written for this check: a story with dialogue, an explanation, a recipe, a Python function, numbers and
/// dates, plain facts. One score then covers the kinds of text a model meets, and no choice of the quantizer was
/// tuned on it. SmolLM2 reads it as 653 tokens, Gemma 3 as 655.
pub const BUILT_IN_TEXT: &str = include_str!("check_text.txt");

/// Most tokens of a text the check scores (its start): one pass of each model over a context this long.
pub const MAX_TOKENS: usize = 1024;

/// What the check measured.
#[derive(Debug, Clone, Copy)]
pub struct CheckReport {
    pub divergence: DivergenceReport,
    /// Tokens of the text run through both models (the first is not scored: nothing predicts it).
    pub tokens: usize,
}

/// Scores `other` against `base` on the first [`MAX_TOKENS`] tokens of `text` (fewer if the model's trained context
/// is shorter), every position after the first, both with a KV cache of `kv`. The two models must share
/// `tokenizer`'s vocabulary.
pub fn check(
    base: &Model,
    other: &Model,
    tokenizer: &Tokenizer,
    text: &str,
    kv: KvDtype,
) -> Result<CheckReport, EvalError> {
    let mut tokens = tokenize_text(tokenizer, text);
    tokens.truncate(MAX_TOKENS.min(base.config.n_ctx_train));
    let divergence = compare_continuation(base, other, &tokens, 1, kv)?;
    Ok(CheckReport { divergence, tokens: tokens.len() })
}
