//! gemma3: the embedding is scaled by √n_embd; RMSNorm before and after attention and the feed-forward; per-head
//! RMSNorm on queries and keys; GELU-gated feed-forward; rotary embeddings on halves (NeoX style); and interleaved
//! sliding-window attention: five of every six layers see only the last `sliding_window` tokens and rotate with
//! base 10 000, every sixth sees everything and rotates with `rope.freq_base`. These facts are the model's
//! definition (Gemma 3 technical report; Hugging Face `Gemma3TextConfig` defaults: `sliding_window_pattern = 6`,
//! `rope_local_base_freq = 10000`, `query_pre_attn_scalar = head_dim`).
//!
//! The GGUF converter already stores RMSNorm weights as `1 + w`, so the shared RMSNorm applies them unchanged.

use crate::gguf::{GgufError, Metadata};
use crate::model::config::{Activation, ModelConfig, RopeStyle};

/// One layer in this many uses full (global) attention; the others slide.
const SWA_PATTERN: usize = 6;
/// Rotary base of the sliding-window layers.
const ROPE_BASE_LOCAL: f32 = 10_000.0;

pub fn configure(config: &mut ModelConfig, meta: &Metadata) -> Result<(), GgufError> {
    config.rope_style = RopeStyle::Neox;
    config.activation = Activation::GeluTanh;
    config.qk_norm = true;
    config.post_norms = true;
    config.embed_scale = Some((config.n_embd as f32).sqrt());
    config.rope_base_swa = ROPE_BASE_LOCAL;
    // Scaled by query_pre_attn_scalar^-1/2, which equals head_dim for every released Gemma 3 size.
    config.attn_scale = 1.0 / (config.head_dim as f32).sqrt();
    let window = meta.get_usize("gemma3.attention.sliding_window")?;
    if window == 0 {
        return Err(GgufError::ValueOutOfRange {
            key: "gemma3.attention.sliding_window".into(),
            value: "0".into(),
            why: "must be positive".into(),
        });
    }
    config.sliding_window = Some(window);
    config.layer_is_swa = (0..config.n_layer).map(|il| (il + 1) % SWA_PATTERN != 0).collect();
    Ok(())
}
