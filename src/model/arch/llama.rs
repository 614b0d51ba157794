//! llama (and the many models that share its GGUF layout, such as SmolLM2): RMSNorm, rotary embeddings on adjacent
//! pairs, grouped-query attention, SwiGLU feed-forward, output weights tied to the embedding when `output.weight`
//! is absent. Every default in `ModelConfig::from_metadata` already describes llama, so nothing changes here.

use crate::gguf::{GgufError, Metadata};
use crate::model::config::{Activation, ModelConfig, RopeStyle};

pub fn configure(config: &mut ModelConfig, _meta: &Metadata) -> Result<(), GgufError> {
    config.rope_style = RopeStyle::Interleaved;
    config.activation = Activation::Silu;
    Ok(())
}
