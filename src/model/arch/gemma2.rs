//! gemma2: gemma3's decoder without the per-head query/key norms and with soft-capping instead: attention scores
//! become `cap·tanh(score/cap)` (`attn_logit_softcapping`), and so do the final logits. Even layers slide over
//! `sliding_window` tokens, odd ones see everything, all with one rotary base (Hugging Face `Gemma2DecoderLayer`:
//! sliding when `layer_idx % 2 == 0`). Norms before and after attention and the feed-forward, GELU-gated, NeoX
//! rotation, embedding scaled by √n_embd; the converter stores RMSNorm weights as `1 + w`.

use crate::gguf::{GgufError, Metadata};
use crate::model::config::{Activation, ModelConfig, RopeStyle};

/// Gemma 2 27B, the one size whose `query_pre_attn_scalar` (144 = n_embd / n_head) is not its head width; it is
/// known by its depth, as llama.cpp does (the converter does not store the scalar).
const LAYERS_27B: usize = 46;

pub fn configure(config: &mut ModelConfig, meta: &Metadata) -> Result<(), GgufError> {
    config.rope_style = RopeStyle::Neox;
    config.activation = Activation::GeluTanh;
    config.post_norms = true;
    config.embed_scale = Some((config.n_embd as f32).sqrt());
    let scalar = if config.n_layer == LAYERS_27B { config.n_embd / config.n_head } else { config.head_dim };
    config.attn_scale = 1.0 / (scalar as f32).sqrt();
    super::sliding_window(config, meta, false)?;
    config.layer_is_swa = (0..config.n_layer).map(|il| config.sliding_window.is_some() && il % 2 == 0).collect();
    Ok(())
}
