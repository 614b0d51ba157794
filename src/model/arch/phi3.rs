//! phi3 (Phi-3, Phi-3.5-mini, Phi-4-mini): llama's decoder with the query, key and value projections in one
//! `attn_qkv` matrix and the gate and up projections in one `ffn_up` matrix (gate rows first), which the loader
//! splits by rows; rotary embeddings on halves (NeoX style); every layer slides when the metadata sets a window.
//! The long-context variants' `rope_factors_long/short` are not consumed, so such files are refused by name.

use crate::gguf::{GgufError, Metadata};
use crate::model::config::{Activation, ModelConfig, RopeStyle};

pub fn configure(config: &mut ModelConfig, meta: &Metadata) -> Result<(), GgufError> {
    config.rope_style = RopeStyle::Neox;
    config.activation = Activation::Silu;
    config.fused_qkv = true;
    config.fused_gate_up = true;
    super::sliding_window(config, meta, true)
}
