//! qwen3moe (Qwen3-30B-A3B style): qwen3's attention, and in every layer a mixture of experts in place of the
//! feed-forward: a router (`ffn_gate_inp`) scores the experts, a softmax over all of them, the top
//! `expert_used_count` kept and (as `norm_topk_prob` says; llama.cpp assumes it for this architecture) renormalised,
//! and the token's output is their weighted sum of SwiGLU experts from the 3-D `ffn_*_exps` tensors.

use crate::gguf::{GgufError, Metadata};
use crate::model::config::{Activation, ModelConfig, Moe, RopeStyle};

/// llama.cpp's `expert_gating_func` value for a softmax router.
const GATING_SOFTMAX: u32 = 1;

pub fn configure(config: &mut ModelConfig, meta: &Metadata) -> Result<(), GgufError> {
    config.rope_style = RopeStyle::Neox;
    config.activation = Activation::Silu;
    config.qk_norm = true;
    let n_expert = meta.get_usize("qwen3moe.expert_count")?;
    let n_used = meta.get_usize("qwen3moe.expert_used_count")?;
    let bad =
        |key: &str, value: String, why: &str| GgufError::ValueOutOfRange { key: key.into(), value, why: why.into() };
    if !(1..=256).contains(&n_expert) || !(1..=n_expert).contains(&n_used) {
        let why = "expert_count must be 1..=256 and expert_used_count 1..=expert_count";
        return Err(bad("qwen3moe.expert_used_count", format!("{n_used} of {n_expert}"), why));
    }
    let n_ff = meta.get_usize("qwen3moe.expert_feed_forward_length")?;
    if !(1..=1 << 20).contains(&n_ff) {
        return Err(bad("qwen3moe.expert_feed_forward_length", n_ff.to_string(), "must be 1..=1048576"));
    }
    if let Some(g) = meta.opt_u32("qwen3moe.expert_gating_func")?
        && g != GATING_SOFTMAX
    {
        return Err(bad("qwen3moe.expert_gating_func", g.to_string(), "only a softmax router (1) is supported"));
    }
    if let Some(s) = meta.opt_f32("qwen3moe.expert_weights_scale")?
        && s != 1.0
    {
        return Err(bad("qwen3moe.expert_weights_scale", s.to_string(), "only 1.0 is supported"));
    }
    let norm_weights = meta.opt_bool("qwen3moe.expert_weights_norm")?.unwrap_or(true);
    config.moe = Some(Moe { n_expert, n_used, n_ff, norm_weights });
    Ok(())
}
