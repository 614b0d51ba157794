//! llama (Llama 2/3.x, Mistral, SmolLM2 and the many models that share its GGUF layout): RMSNorm, rotary
//! embeddings on adjacent pairs, grouped-query attention, SwiGLU feed-forward, output weights tied to the
//! embedding when `output.weight` is absent. Llama 3.1's rope scaling arrives as per-frequency divisors in
//! `rope_freqs.weight` (the shared loader applies them); Mistral's window, when the metadata sets one, slides on
//! every layer.

use crate::gguf::{GgufError, Metadata};
use crate::model::config::{Activation, ModelConfig, RopeStyle};

pub fn configure(config: &mut ModelConfig, meta: &Metadata) -> Result<(), GgufError> {
    config.rope_style = RopeStyle::Interleaved;
    config.activation = Activation::Silu;
    super::sliding_window(config, meta, true)
}
