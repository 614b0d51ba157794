//! The model's hyper-parameters, read from GGUF metadata in one place.
//!
//! Required keys fail by name; optional keys get the defaults documented beside them. The per-architecture files
//! (`arch/*.rs`) only say which quirks apply; everything else is common to the decoder family.

use crate::gguf::{GgufError, Metadata};

/// The architectures the shared decoder can run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Arch {
    Llama,
    Qwen2,
    Qwen3,
    Phi3,
    Gemma2,
    Gemma3,
    Qwen3Moe,
}

/// Every architecture with its GGUF name, in one table so the two directions cannot disagree.
const ARCHES: [(Arch, &str); 7] = [
    (Arch::Llama, "llama"),
    (Arch::Qwen2, "qwen2"),
    (Arch::Qwen3, "qwen3"),
    (Arch::Phi3, "phi3"),
    (Arch::Gemma2, "gemma2"),
    (Arch::Gemma3, "gemma3"),
    (Arch::Qwen3Moe, "qwen3moe"),
];

impl Arch {
    pub fn from_name(name: &str) -> Option<Arch> {
        ARCHES.iter().find(|(_, n)| *n == name).map(|(a, _)| *a)
    }

    pub fn name(self) -> &'static str {
        ARCHES.iter().find(|(a, _)| *a == self).map_or("?", |(_, n)| n)
    }

    /// The supported names, for error messages.
    pub fn names() -> String {
        ARCHES.iter().map(|(_, n)| *n).collect::<Vec<_>>().join(", ")
    }
}

/// The feed-forward gate's activation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Activation {
    /// SiLU (SwiGLU feed-forward): llama.
    Silu,
    /// GELU, tanh approximation (GeGLU feed-forward): gemma.
    GeluTanh,
}

/// How rotary embeddings pair up the dimensions of a head.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RopeStyle {
    /// Adjacent pairs (x0, x1), (x2, x3), ...: llama GGUFs (the converter permuted Q and K to this layout).
    Interleaved,
    /// Halves (x_i, x_{i + n/2}): GPT-NeoX style, used by gemma.
    Neox,
}

/// Everything the decoder needs to know about the model's shape.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelConfig {
    pub arch: Arch,
    pub n_vocab: usize,
    pub n_embd: usize,
    pub n_layer: usize,
    pub n_head: usize,
    pub n_head_kv: usize,
    /// Width of one query/key head.
    pub head_dim: usize,
    /// Width of one value head.
    pub head_dim_v: usize,
    pub n_ff: usize,
    /// The context length the model was trained for.
    pub n_ctx_train: usize,
    pub rms_eps: f32,
    /// Rotated dimensions per head (`rope.dimension_count`, default the whole head).
    pub n_rot: usize,
    pub rope_style: RopeStyle,
    /// Rotary base for full-attention layers.
    pub rope_base: f32,
    /// Rotary base for sliding-window layers (gemma3 uses a different one).
    pub rope_base_swa: f32,
    /// Positions are divided by this before rotation (`rope.scaling.type = linear`).
    pub rope_scale: f32,
    /// Sliding-window size for the layers that use one.
    pub sliding_window: Option<usize>,
    /// Per layer: whether it attends only within the sliding window.
    pub layer_is_swa: Vec<bool>,
    /// Multiply the token embedding by this (gemma: √n_embd).
    pub embed_scale: Option<f32>,
    /// Attention logits are scaled by this (usually 1/√head_dim).
    pub attn_scale: f32,
    pub activation: Activation,
    /// RMSNorm on each query and key head before rotation (gemma3).
    pub qk_norm: bool,
    /// RMSNorm on the attention and feed-forward outputs before the residual add (gemma2/3).
    pub post_norms: bool,
    /// Softcap on the final logits (`final_logit_softcapping`), if any.
    pub final_logit_softcap: Option<f32>,
    /// Softcap on the scaled attention scores (`attn_logit_softcapping`, gemma2), if any.
    pub attn_softcap: Option<f32>,
    /// Biases on the query, key and value projections (qwen2).
    pub qkv_bias: bool,
    /// Query, key and value stored as one `attn_qkv` matrix (phi3).
    pub fused_qkv: bool,
    /// Gate and up projections stored as one `ffn_up` matrix of `2·n_ff` rows, gate first (phi3).
    pub fused_gate_up: bool,
    /// A mixture of experts in place of every layer's feed-forward (qwen3moe).
    pub moe: Option<Moe>,
}

/// A mixture-of-experts feed-forward: a router picks `n_used` of `n_expert` SwiGLU experts per token.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Moe {
    pub n_expert: usize,
    pub n_used: usize,
    /// One expert's feed-forward width.
    pub n_ff: usize,
    /// Whether the chosen experts' softmax weights are renormalised to sum to 1 (`norm_topk_prob`).
    pub norm_weights: bool,
}

/// Upper bounds on metadata-derived sizes: a hostile file must not make us allocate or loop without limit before
/// the tensors have been checked against these numbers.
const MAX_LAYERS: usize = 1024;
const MAX_HEADS: usize = 4096;
const MAX_DIM: usize = 1 << 20;

impl ModelConfig {
    /// Reads the configuration common to the decoder family; the architecture file adjusts the quirks.
    pub fn from_metadata(meta: &Metadata) -> Result<ModelConfig, GgufError> {
        // A shard holds only some of the tensors; the rest live in sibling files this loader does not open.
        if let Some(n) = meta.opt_u64("split.count")?
            && n > 1
        {
            return Err(GgufError::ValueOutOfRange {
                key: "split.count".into(),
                value: n.to_string(),
                why: "split (sharded) GGUF files are not supported: merge the shards into one file first".into(),
            });
        }
        let arch_name = meta.architecture()?;
        let arch = Arch::from_name(arch_name).ok_or_else(|| GgufError::ValueOutOfRange {
            key: "general.architecture".into(),
            value: arch_name.to_string(),
            why: format!("this architecture is not supported (supported: {})", Arch::names()),
        })?;
        let k = |suffix: &str| format!("{arch_name}.{suffix}");
        let bounded = |key: String, max: usize| -> Result<usize, GgufError> {
            let v = meta.get_usize(&key)?;
            if v == 0 || v > max {
                return Err(GgufError::ValueOutOfRange {
                    key,
                    value: v.to_string(),
                    why: format!("must be 1..={max}"),
                });
            }
            Ok(v)
        };
        let n_embd = bounded(k("embedding_length"), MAX_DIM)?;
        let n_layer = bounded(k("block_count"), MAX_LAYERS)?;
        let n_head = bounded(k("attention.head_count"), MAX_HEADS)?;
        // head_count_kv defaults to head_count (no grouping).
        let n_head_kv = match meta.opt_usize(&k("attention.head_count_kv"))? {
            Some(_) => bounded(k("attention.head_count_kv"), MAX_HEADS)?,
            None => n_head,
        };
        if n_head % n_head_kv != 0 {
            return Err(GgufError::ValueOutOfRange {
                key: k("attention.head_count_kv"),
                value: n_head_kv.to_string(),
                why: format!("head_count {n_head} is not a multiple of it"),
            });
        }
        let head_dim = match meta.opt_usize(&k("attention.key_length"))? {
            Some(_) => bounded(k("attention.key_length"), MAX_DIM)?,
            None => {
                if n_embd % n_head != 0 {
                    return Err(GgufError::ValueOutOfRange {
                        key: k("embedding_length"),
                        value: n_embd.to_string(),
                        why: format!("not a multiple of head_count {n_head}"),
                    });
                }
                n_embd / n_head
            }
        };
        let head_dim_v = match meta.opt_usize(&k("attention.value_length"))? {
            Some(_) => bounded(k("attention.value_length"), MAX_DIM)?,
            None => head_dim,
        };
        let n_ff = bounded(k("feed_forward_length"), MAX_DIM * 16)?;
        let n_rot = meta.opt_usize(&k("rope.dimension_count"))?.unwrap_or(head_dim);
        if n_rot > head_dim || n_rot % 2 != 0 {
            return Err(GgufError::ValueOutOfRange {
                key: k("rope.dimension_count"),
                value: n_rot.to_string(),
                why: format!("must be even and at most the head width {head_dim}"),
            });
        }
        let positive = |key: String, default: f32| -> Result<f32, GgufError> {
            let v = meta.opt_f32(&key)?.unwrap_or(default);
            if !(v.is_finite() && v > 0.0) {
                return Err(GgufError::ValueOutOfRange {
                    key,
                    value: v.to_string(),
                    why: "must be finite and > 0".into(),
                });
            }
            Ok(v)
        };
        // llama.cpp's defaults: rms eps 1e-5, rope base 10000.
        let rms_eps = positive(k("attention.layer_norm_rms_epsilon"), 1e-5)?;
        let rope_base = positive(k("rope.freq_base"), 10_000.0)?;
        let rope_scale = match meta.opt_str(&k("rope.scaling.type"))? {
            None | Some("none") => 1.0,
            Some("linear") => positive(k("rope.scaling.factor"), 1.0)?,
            Some(other) => {
                return Err(GgufError::ValueOutOfRange {
                    key: k("rope.scaling.type"),
                    value: other.to_string(),
                    why: "only linear rope scaling is supported".into(),
                });
            }
        };
        let n_tokens = meta.opt_array("tokenizer.ggml.tokens")?.map(|a| a.len());
        let n_vocab = match (meta.opt_usize(&k("vocab_size"))?, n_tokens) {
            (Some(n), Some(t)) if n != t => {
                return Err(GgufError::ValueOutOfRange {
                    key: k("vocab_size"),
                    value: n.to_string(),
                    why: format!("tokenizer.ggml.tokens has {t} entries; token ids and embedding rows must agree"),
                });
            }
            (Some(n), _) => n,
            (None, Some(t)) => t,
            (None, None) => return Err(GgufError::MissingKey { key: "tokenizer.ggml.tokens".into() }),
        };
        if n_vocab == 0 {
            return Err(GgufError::ValueOutOfRange {
                key: k("vocab_size"),
                value: "0".into(),
                why: "empty vocabulary".into(),
            });
        }
        let n_ctx_train = meta.opt_usize(&k("context_length"))?.unwrap_or(2048).max(1);
        let final_logit_softcap = meta.opt_f32(&k("final_logit_softcapping"))?.filter(|c| *c > 0.0);
        let attn_softcap = meta.opt_f32(&k("attn_logit_softcapping"))?.filter(|c| *c > 0.0);
        let mut config = ModelConfig {
            arch,
            n_vocab,
            n_embd,
            n_layer,
            n_head,
            n_head_kv,
            head_dim,
            head_dim_v,
            n_ff,
            n_ctx_train,
            rms_eps,
            n_rot,
            rope_style: RopeStyle::Interleaved,
            rope_base,
            rope_base_swa: rope_base,
            rope_scale,
            sliding_window: None,
            layer_is_swa: vec![false; n_layer],
            embed_scale: None,
            attn_scale: 1.0 / (head_dim as f32).sqrt(),
            activation: Activation::Silu,
            qk_norm: false,
            post_norms: false,
            final_logit_softcap,
            attn_softcap,
            qkv_bias: false,
            fused_qkv: false,
            fused_gate_up: false,
            moe: None,
        };
        use super::arch as quirks;
        match arch {
            Arch::Llama => quirks::llama::configure(&mut config, meta)?,
            Arch::Qwen2 => quirks::qwen2::configure(&mut config, meta)?,
            Arch::Qwen3 => quirks::qwen3::configure(&mut config, meta)?,
            Arch::Phi3 => quirks::phi3::configure(&mut config, meta)?,
            Arch::Gemma2 => quirks::gemma2::configure(&mut config, meta)?,
            Arch::Gemma3 => quirks::gemma3::configure(&mut config, meta)?,
            Arch::Qwen3Moe => quirks::qwen3moe::configure(&mut config, meta)?,
        }
        Ok(config)
    }

    /// Width of the concatenated query heads.
    pub fn q_dim(&self) -> usize {
        self.n_head * self.head_dim
    }

    /// Width of the concatenated key heads (one cache row per layer).
    pub fn k_dim(&self) -> usize {
        self.n_head_kv * self.head_dim
    }

    /// Width of the concatenated value heads.
    pub fn v_dim(&self) -> usize {
        self.n_head_kv * self.head_dim_v
    }

    /// Query heads per key/value head.
    pub fn gqa_group(&self) -> usize {
        self.n_head / self.n_head_kv
    }
}
