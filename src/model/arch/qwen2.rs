//! qwen2 (Qwen2, Qwen2.5): llama's decoder with biases on the query, key and value projections, and rotary
//! embeddings on halves (NeoX style: the converter does not permute Qwen's query and key rows).

use crate::gguf::{GgufError, Metadata};
use crate::model::config::{Activation, ModelConfig, RopeStyle};

pub fn configure(config: &mut ModelConfig, _meta: &Metadata) -> Result<(), GgufError> {
    config.rope_style = RopeStyle::Neox;
    config.activation = Activation::Silu;
    config.qkv_bias = true;
    Ok(())
}
