//! Per-architecture quirks over the shared decoder: which keys and tensors exist and what they mean. Each file is a
//! few dozen lines; the forward pass itself lives once, in `model::forward`.

pub mod gemma2;
pub mod gemma3;
pub mod llama;
pub mod phi3;
pub mod qwen2;
pub mod qwen3;
pub mod qwen3moe;

use crate::gguf::{GgufError, Metadata};
use crate::model::config::ModelConfig;

/// `{arch}.attention.sliding_window`, where 0 or absent means none. With `every_layer`, all layers slide (Mistral,
/// Phi-3); otherwise the architecture file says which do.
pub fn sliding_window(config: &mut ModelConfig, meta: &Metadata, every_layer: bool) -> Result<(), GgufError> {
    let key = format!("{}.attention.sliding_window", config.arch.name());
    config.sliding_window = meta.opt_usize(&key)?.filter(|&w| w > 0);
    if every_layer && config.sliding_window.is_some() {
        config.layer_is_swa = vec![true; config.n_layer];
    }
    Ok(())
}
