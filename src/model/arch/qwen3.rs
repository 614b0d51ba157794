//! qwen3: llama's decoder without projection biases, with per-head RMSNorm on queries and keys before rotation,
//! and rotary embeddings on halves (NeoX style).

use crate::gguf::{GgufError, Metadata};
use crate::model::config::{Activation, ModelConfig, RopeStyle};

pub fn configure(config: &mut ModelConfig, _meta: &Metadata) -> Result<(), GgufError> {
    config.rope_style = RopeStyle::Neox;
    config.activation = Activation::Silu;
    config.qk_norm = true;
    Ok(())
}
