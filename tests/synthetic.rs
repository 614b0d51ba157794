//! Tiny synthetic models, written by the tests with our GGUF writer: a llama-style and a gemma3-style decoder
//! with random weights in a chosen format and a byte-level vocabulary.

use infer::gguf::{GgufWriter, MetaArray, MetaValue, StrList};
use infer::kernels::GgmlType;
use infer::kernels::quant::{self, blocks_as_bytes};

/// Deterministic pseudo-random numbers (SplitMix64), so every run builds the same model.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [-1, 1).
    pub fn uniform(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 / (1u64 << 23) as f32 - 1.0
    }
}

/// Encodes f32 values in format `ty` with the reference quantizers.
pub fn encode(ty: GgmlType, values: &[f32]) -> Vec<u8> {
    fn q<T: quant::Block>(values: &[f32], block: usize, f: fn(&[f32], &mut [T]), zero: T) -> Vec<u8> {
        let mut blocks = vec![zero; values.len() / block];
        f(values, &mut blocks);
        blocks_as_bytes(&blocks).to_vec()
    }
    match ty {
        GgmlType::F32 => values.iter().flat_map(|v| v.to_le_bytes()).collect(),
        GgmlType::F16 => values.iter().flat_map(|v| half::f16::from_f32(*v).to_le_bytes()).collect(),
        GgmlType::Q8_0 => q(values, 32, quant::q8_0::quantize_row_ref, quant::BlockQ8_0::default()),
        GgmlType::Q4_0 => q(values, 32, quant::q4_0::quantize_row_ref, quant::BlockQ4_0::default()),
        GgmlType::Q4_1 => q(values, 32, quant::q4_1::quantize_row_ref, quant::BlockQ4_1::default()),
        GgmlType::Q5_0 => q(values, 32, quant::q5_0::quantize_row_ref, quant::BlockQ5_0::default()),
        other => panic!("synthetic models do not use {other}"),
    }
}

/// Shape and flavour of a synthetic model.
#[derive(Clone, Copy)]
pub struct Spec {
    pub gemma: bool,
    pub weight_type: GgmlType,
    pub n_embd: usize,
    pub n_layer: usize,
    pub n_head: usize,
    pub n_head_kv: usize,
    pub head_dim: usize,
    pub n_ff: usize,
    pub n_vocab: usize,
    pub sliding_window: usize,
}

impl Spec {
    pub fn llama(weight_type: GgmlType) -> Spec {
        Spec {
            gemma: false,
            weight_type,
            n_embd: 64,
            n_layer: 2,
            n_head: 4,
            n_head_kv: 2,
            head_dim: 16,
            n_ff: 128,
            n_vocab: 256 + 3,
            sliding_window: 0,
        }
    }

    pub fn gemma(weight_type: GgmlType) -> Spec {
        Spec { gemma: true, n_layer: 6, n_head_kv: 1, head_dim: 32, sliding_window: 8, ..Spec::llama(weight_type) }
    }
}

/// A GGUF writer holding the whole model, with a byte-level BPE vocabulary (no merges needed for tokens that are
/// single bytes) and three special tokens.
pub fn build(spec: Spec, seed: u64) -> GgufWriter {
    let mut rng = Rng::new(seed);
    let arch = if spec.gemma { "gemma3" } else { "llama" };
    let mut w = GgufWriter::new();
    let k = |s: &str| format!("{arch}.{s}");
    w.set_str("general.architecture", arch)
        .set_str("general.name", "synthetic")
        .set_u32(&k("context_length"), 256)
        .set_u32(&k("embedding_length"), spec.n_embd as u32)
        .set_u32(&k("block_count"), spec.n_layer as u32)
        .set_u32(&k("feed_forward_length"), spec.n_ff as u32)
        .set_u32(&k("attention.head_count"), spec.n_head as u32)
        .set_u32(&k("attention.head_count_kv"), spec.n_head_kv as u32)
        .set_u32(&k("attention.key_length"), spec.head_dim as u32)
        .set_u32(&k("attention.value_length"), spec.head_dim as u32)
        .set_f32(&k("attention.layer_norm_rms_epsilon"), 1e-6)
        .set_f32(&k("rope.freq_base"), 10000.0);
    if spec.gemma {
        w.set_u32(&k("attention.sliding_window"), spec.sliding_window as u32);
    }
    // Vocabulary: three specials, then one token per byte in GPT-2's byte-to-unicode spelling.
    let mut tokens = vec!["<|endoftext|>".to_string(), "<|im_start|>".to_string(), "<|im_end|>".to_string()];
    tokens.extend((0..=255u8).map(byte_to_unicode));
    let mut types = vec![3i32; 3];
    types.extend(std::iter::repeat_n(1i32, 256));
    w.set_str("tokenizer.ggml.model", "gpt2")
        .set_str("tokenizer.ggml.pre", "gpt2")
        .set("tokenizer.ggml.tokens", MetaValue::Array(MetaArray::String(tokens.into())))
        .set("tokenizer.ggml.token_type", MetaValue::Array(MetaArray::I32(types)))
        .set("tokenizer.ggml.merges", MetaValue::Array(MetaArray::String(StrList::default())))
        .set_u32("tokenizer.ggml.bos_token_id", 1)
        .set_u32("tokenizer.ggml.eos_token_id", 2)
        .set_bool("tokenizer.ggml.add_bos_token", false);

    let mut matrix = |w: &mut GgufWriter, name: &str, rows: usize, cols: usize, ty: GgmlType, scale: f32| {
        let values: Vec<f32> = (0..rows * cols).map(|_| rng.uniform() * scale).collect();
        w.add_tensor(name, &[cols as u64, rows as u64], ty, encode(ty, &values)).unwrap();
    };
    let (e, qd, kd, ff) = (spec.n_embd, spec.n_head * spec.head_dim, spec.n_head_kv * spec.head_dim, spec.n_ff);
    let ty = spec.weight_type;
    matrix(&mut w, "token_embd.weight", spec.n_vocab, e, GgmlType::Q8_0, 1.0);
    let ones = |n: usize| vec![1.0f32; n];
    let norm = |w: &mut GgufWriter, name: &str, n: usize| w.add_f32(name, &[n as u64], &ones(n)).unwrap();
    norm(&mut w, "output_norm.weight", e);
    for il in 0..spec.n_layer {
        let n = |s: &str| format!("blk.{il}.{s}.weight");
        let s_in = 1.0 / (e as f32).sqrt();
        norm(&mut w, &n("attn_norm"), e);
        matrix(&mut w, &n("attn_q"), qd, e, ty, s_in);
        matrix(&mut w, &n("attn_k"), kd, e, ty, s_in);
        matrix(&mut w, &n("attn_v"), kd, e, ty, s_in);
        matrix(&mut w, &n("attn_output"), e, qd, ty, 1.0 / (qd as f32).sqrt());
        norm(&mut w, &n("ffn_norm"), e);
        matrix(&mut w, &n("ffn_gate"), ff, e, ty, s_in);
        matrix(&mut w, &n("ffn_up"), ff, e, ty, s_in);
        matrix(&mut w, &n("ffn_down"), e, ff, ty, 1.0 / (ff as f32).sqrt());
        if spec.gemma {
            norm(&mut w, &n("attn_q_norm"), spec.head_dim);
            norm(&mut w, &n("attn_k_norm"), spec.head_dim);
            norm(&mut w, &n("post_attention_norm"), e);
            norm(&mut w, &n("post_ffw_norm"), e);
        }
    }
    w
}

/// GPT-2's reversible byte → printable-character map, as a token text.
pub fn byte_to_unicode(b: u8) -> String {
    let printable = (b'!'..=b'~').contains(&b) || (0xA1..=0xAC).contains(&b) || (0xAE..=0xFF).contains(&b);
    if printable {
        char::from_u32(b as u32).unwrap().to_string()
    } else {
        // Non-printable bytes map, in order, to code points from 256 up.
        let rank = (0..b)
            .filter(|&x| !((b'!'..=b'~').contains(&x) || (0xA1..=0xAC).contains(&x) || (0xAE..=0xFF).contains(&x)))
            .count();
        char::from_u32(256 + rank as u32).unwrap().to_string()
    }
}
