//! What the fuzz targets share: a tiny model whose shapes, metadata, vocabulary and weights the fuzzer chooses.
//!
//! Raw bytes mutated by libFuzzer rarely get past the GGUF header, so the `model` and `forward` targets build their
//! input instead: a [`FuzzModel`] (from `arbitrary`) becomes a GGUF file that is valid by default (consistent
//! shapes, a byte-level vocabulary) and then broken in the ways the fuzzer picks: metadata keys overridden with
//! values of any type, a tensor dropped, reshaped or added, token types and special ids changed, weights filled
//! with arbitrary bytes (NaN and infinite scales included).

use arbitrary::Arbitrary;
use infer::gguf::{GgufWriter, MetaArray, MetaValue};
use infer::kernels::GgmlType;

/// Weight formats: every one the decoder runs (BF16 matrices are widened to f32 at load).
const TYPES: [GgmlType; 10] = [
    GgmlType::F32,
    GgmlType::F16,
    GgmlType::Q8_0,
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q5_0,
    GgmlType::Q2_K,
    GgmlType::Q4_K,
    GgmlType::Q6_K,
    GgmlType::BF16,
];

/// Keys a fuzz model may override; `{a}` is the architecture.
const KEYS: [&str; 34] = [
    "{a}.context_length",
    "{a}.embedding_length",
    "{a}.block_count",
    "{a}.feed_forward_length",
    "{a}.attention.head_count",
    "{a}.attention.head_count_kv",
    "{a}.attention.key_length",
    "{a}.attention.value_length",
    "{a}.attention.layer_norm_rms_epsilon",
    "{a}.rope.freq_base",
    "{a}.rope.dimension_count",
    "{a}.rope.scaling.type",
    "{a}.rope.scaling.factor",
    "{a}.attention.sliding_window",
    "{a}.vocab_size",
    "{a}.final_logit_softcapping",
    "general.architecture",
    "general.alignment",
    "tokenizer.ggml.model",
    "tokenizer.ggml.pre",
    "tokenizer.ggml.bos_token_id",
    "tokenizer.ggml.eos_token_id",
    "tokenizer.ggml.eot_token_id",
    "tokenizer.ggml.eom_token_id",
    "tokenizer.ggml.unknown_token_id",
    "tokenizer.ggml.padding_token_id",
    "tokenizer.ggml.add_bos_token",
    "tokenizer.ggml.add_space_prefix",
    "tokenizer.ggml.token_type",
    "tokenizer.ggml.scores",
    "tokenizer.ggml.merges",
    "tokenizer.ggml.tokens",
    "tokenizer.chat_template",
    "split.count",
];

/// Tensors the decoder never asks for, and names of real ones, to add.
const EXTRA_TENSORS: [&str; 6] =
    ["rope_freqs.weight", "blk.0.attn_q.bias", "output.weight", "blk.9.ffn_up.weight", "token_embd_norm.weight", ""];

/// A metadata value of any type.
#[derive(Arbitrary, Debug, Clone)]
pub enum FuzzValue {
    U8(u8),
    U32(u32),
    I32(i32),
    U64(u64),
    I64(i64),
    F32(f32),
    Bool(bool),
    Str(String),
    ArrI32(Vec<i32>),
    ArrF32(Vec<f32>),
    ArrStr(Vec<String>),
    ArrU8(Vec<u8>),
}

impl FuzzValue {
    fn to_meta(&self) -> MetaValue {
        match self.clone() {
            FuzzValue::U8(v) => MetaValue::U8(v),
            FuzzValue::U32(v) => MetaValue::U32(v),
            FuzzValue::I32(v) => MetaValue::I32(v),
            FuzzValue::U64(v) => MetaValue::U64(v),
            FuzzValue::I64(v) => MetaValue::I64(v),
            FuzzValue::F32(v) => MetaValue::F32(v),
            FuzzValue::Bool(v) => MetaValue::Bool(v),
            FuzzValue::Str(v) => MetaValue::String(v),
            FuzzValue::ArrI32(v) => MetaValue::Array(MetaArray::I32(v)),
            FuzzValue::ArrF32(v) => MetaValue::Array(MetaArray::F32(v)),
            FuzzValue::ArrStr(v) => MetaValue::Array(MetaArray::String(v.into())),
            FuzzValue::ArrU8(v) => MetaValue::Array(MetaArray::U8(v)),
        }
    }
}

/// A tiny model, chosen by the fuzzer. `FuzzModel::default()` is the valid one with nothing changed: F32, one
/// layer, zero weights (so every token is equally likely).
#[derive(Arbitrary, Debug, Default)]
pub struct FuzzModel {
    pub gemma: bool,
    /// A SentencePiece (`llama`) vocabulary with byte tokens instead of byte-level BPE.
    pub spm: bool,
    width: u8,
    layers: u8,
    heads: u8,
    kv_heads: u8,
    ff: u8,
    weight_type: u8,
    /// Fill norm weights from `weights` too (otherwise 1.0: a NaN norm is refused at load, which would hide the
    /// forward pass from most inputs).
    fuzz_norms: bool,
    overrides: Vec<(u8, FuzzValue)>,
    drop: Option<u16>,
    reshape: Option<(u16, u8)>,
    extra: Option<(u8, u8)>,
    token_types: Vec<(u16, u8)>,
    merges: Vec<(u8, u8)>,
    weights: Vec<u8>,
}

/// GPT-2's byte → printable character map (the byte-level BPE alphabet).
fn byte_char(b: u8) -> char {
    let printable = |x: u8| (b'!'..=b'~').contains(&x) || (0xA1..=0xAC).contains(&x) || (0xAE..=0xFF).contains(&x);
    if printable(b) {
        char::from(b)
    } else {
        let rank = (0..b).filter(|&x| !printable(x)).count() as u32;
        char::from_u32(256 + rank).unwrap_or('?')
    }
}

impl FuzzModel {
    /// The GGUF file, or `None` where the writer itself refuses what was chosen (it validates names and sizes).
    pub fn to_gguf(&self) -> Option<Vec<u8>> {
        let ty = TYPES[self.weight_type as usize % TYPES.len()];
        // Row lengths must be whole blocks of the format.
        let unit = ty.block_size().max(32);
        let n_embd = unit * (1 + self.width as usize % 2);
        let n_head = [1, 2, 4][self.heads as usize % 3];
        let n_head_kv = [1, 2, 4].into_iter().filter(|k| n_head % k == 0).nth(self.kv_heads as usize % 3).unwrap_or(1);
        let head_dim = n_embd / n_head;
        let n_ff = unit * (1 + self.ff as usize % 2);
        let n_layer = 1 + self.layers as usize % 3;
        let arch = if self.gemma { "gemma3" } else { "llama" };

        let mut w = GgufWriter::new();
        let k = |s: &str| format!("{arch}.{s}");
        w.set_str("general.architecture", arch)
            .set_u32(&k("context_length"), 64)
            .set_u32(&k("embedding_length"), n_embd as u32)
            .set_u32(&k("block_count"), n_layer as u32)
            .set_u32(&k("feed_forward_length"), n_ff as u32)
            .set_u32(&k("attention.head_count"), n_head as u32)
            .set_u32(&k("attention.head_count_kv"), n_head_kv as u32)
            .set_f32(&k("attention.layer_norm_rms_epsilon"), 1e-6);
        if self.gemma {
            w.set_u32(&k("attention.sliding_window"), 4);
        }

        // Vocabulary.
        let (mut tokens, mut types, scores): (Vec<String>, Vec<i32>, Option<Vec<f32>>) = if self.spm {
            let mut t = vec!["<unk>".to_string(), "<s>".to_string(), "</s>".to_string()];
            t.extend((0..=255u8).map(|b| format!("<0x{b:02X}>")));
            let mut ty = vec![2, 3, 3];
            ty.extend(std::iter::repeat_n(6, 256));
            t.push("\u{2581}".to_string());
            ty.push(1);
            (t, ty, Some(Vec::new()))
        } else {
            let mut t = vec!["<|endoftext|>".to_string(), "<|im_start|>".to_string(), "<|im_end|>".to_string()];
            t.extend((0..=255u8).map(|b| byte_char(b).to_string()));
            let mut ty = vec![3, 3, 3];
            ty.extend(std::iter::repeat_n(1, 256));
            (t, ty, None)
        };
        let mut merges = Vec::new();
        for &(a, b) in self.merges.iter().take(32) {
            let (ca, cb) = if self.spm {
                (char::from(b'a' + a % 26).to_string(), char::from(b'a' + b % 26).to_string())
            } else {
                (byte_char(a).to_string(), byte_char(b).to_string())
            };
            merges.push(format!("{ca} {cb}"));
            tokens.push(format!("{ca}{cb}"));
            types.push(1);
        }
        for &(i, t) in self.token_types.iter().take(64) {
            let n = types.len();
            types[i as usize % n] = i32::from(t % 8);
        }
        let n_vocab = tokens.len();
        let scores = scores.map(|_| (0..n_vocab).map(|i| -(i as f32)).collect::<Vec<_>>());
        w.set_str("tokenizer.ggml.model", if self.spm { "llama" } else { "gpt2" })
            .set("tokenizer.ggml.tokens", MetaValue::Array(MetaArray::String(tokens.into())))
            .set("tokenizer.ggml.token_type", MetaValue::Array(MetaArray::I32(types)))
            .set_u32("tokenizer.ggml.bos_token_id", 1)
            .set_u32("tokenizer.ggml.eos_token_id", 2);
        if let Some(s) = scores {
            w.set("tokenizer.ggml.scores", MetaValue::Array(MetaArray::F32(s)));
        } else {
            w.set_str("tokenizer.ggml.pre", "gpt2")
                .set("tokenizer.ggml.merges", MetaValue::Array(MetaArray::String(merges.into())));
        }
        for (key, value) in self.overrides.iter().take(8) {
            let key = KEYS[*key as usize % KEYS.len()].replace("{a}", arch);
            w.set(&key, value.to_meta());
        }

        // Tensors: (name, dims, type); then the fuzzer's changes; then data.
        let mut plan: Vec<(String, Vec<u64>, GgmlType)> = Vec::new();
        let mat = |name: String, rows: usize, cols: usize, t: GgmlType| (name, vec![cols as u64, rows as u64], t);
        let vecf = |name: String, n: usize| (name, vec![n as u64], GgmlType::F32);
        plan.push(mat("token_embd.weight".into(), n_vocab, n_embd, ty));
        plan.push(vecf("output_norm.weight".into(), n_embd));
        let (q_dim, kv_dim) = (n_head * head_dim, n_head_kv * head_dim);
        for il in 0..n_layer {
            let n = |s: &str| format!("blk.{il}.{s}.weight");
            plan.push(vecf(n("attn_norm"), n_embd));
            plan.push(mat(n("attn_q"), q_dim, n_embd, ty));
            plan.push(mat(n("attn_k"), kv_dim, n_embd, ty));
            plan.push(mat(n("attn_v"), kv_dim, n_embd, ty));
            plan.push(mat(n("attn_output"), n_embd, q_dim, ty));
            plan.push(vecf(n("ffn_norm"), n_embd));
            plan.push(mat(n("ffn_gate"), n_ff, n_embd, ty));
            plan.push(mat(n("ffn_up"), n_ff, n_embd, ty));
            plan.push(mat(n("ffn_down"), n_embd, n_ff, ty));
            if self.gemma {
                plan.push(vecf(n("attn_q_norm"), head_dim));
                plan.push(vecf(n("attn_k_norm"), head_dim));
                plan.push(vecf(n("post_attention_norm"), n_embd));
                plan.push(vecf(n("post_ffw_norm"), n_embd));
            }
        }
        if let Some(d) = self.drop {
            let i = d as usize % plan.len();
            plan.remove(i);
        }
        if let Some((r, dim)) = self.reshape {
            let i = r as usize % plan.len();
            let block = plan[i].2.block_size() as u64;
            plan[i].1[0] = block * u64::from(1 + dim % 16);
        }
        if let Some((e, len)) = self.extra {
            let name = EXTRA_TENSORS[e as usize % EXTRA_TENSORS.len()];
            plan.push((name.to_string(), vec![32 * u64::from(1 + len % 4)], GgmlType::F32));
        }
        let mut fill = self.weights.iter().copied().cycle();
        let mut next = |n: usize| -> Vec<u8> {
            if self.weights.is_empty() { vec![0; n] } else { (0..n).map(|_| fill.next().unwrap_or(0)).collect() }
        };
        for (name, dims, t) in plan {
            let (_, n_bytes) = infer::gguf::tensor_extent(&name, &dims, t).ok()?;
            let data = if t == GgmlType::F32 && !self.fuzz_norms {
                std::iter::repeat_n(1.0f32.to_le_bytes(), n_bytes as usize / 4).flatten().collect()
            } else {
                next(n_bytes as usize)
            };
            w.add_tensor(&name, &dims, t, data).ok()?;
        }
        w.to_bytes().ok()
    }
}
