//! One regression case or more for every entry of the catalogue of malformed and hostile GGUF input in
//! `../shared/RELIABILITY.md` (§1, entries 1 to 50).
//!
//! Each case is a file, built here byte by byte or from a synthetic model with one thing broken. Every case goes
//! through two checks:
//! - the library loads it as `infer` does (GgufFile, Model, Tokenizer, chat template and one render) on a thread
//!   whose allocations may not pass 16 × the file's size + 64 MiB (RELIABILITY.md's G1: nothing sized by a count or
//!   length the file merely claims), and must fail with an error naming the key, tensor or offset, or succeed where
//!   the catalogue says the input is valid;
//! - `infer run` on it must exit non-zero with one line naming the same thing (no panic, no signal), or succeed.
//!
//! Entries that are not about one file (46-48: templates and the one loader; 49: the quantize path) have their own
//! tests below.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use infer::gguf::{GgufFile, GgufWriter, MetaArray, MetaValue, StrList};
use infer::kernels::GgmlType;
use infer::kernels::budget::{Bounded, run_bounded};
use infer::model::Model;
use infer::tokenizer::{ChatMessage, ChatTemplate, Tokenizer, VocabSpec};

use crate::common::{assert_clean_failure, infer, tempdir};
use crate::synthetic::{Spec, build};

/// A GGUF file built byte by byte: header, key-value pairs, tensor records, padding, data.
#[derive(Clone)]
struct Raw {
    version: u32,
    counts: Option<(u64, u64)>,
    kvs: Vec<Vec<u8>>,
    tensors: Vec<Vec<u8>>,
    data: usize,
    pad: bool,
}

fn gstr(s: &[u8]) -> Vec<u8> {
    let mut b = (s.len() as u64).to_le_bytes().to_vec();
    b.extend(s);
    b
}

impl Raw {
    fn new() -> Raw {
        Raw { version: 3, counts: None, kvs: Vec::new(), tensors: Vec::new(), data: 0, pad: true }
    }

    fn version(mut self, v: u32) -> Raw {
        self.version = v;
        self
    }

    /// Header counts that differ from what follows.
    fn counts(mut self, n_tensors: u64, n_kv: u64) -> Raw {
        self.counts = Some((n_tensors, n_kv));
        self
    }

    fn kv_raw(mut self, key: &[u8], type_id: u32, value: &[u8]) -> Raw {
        let mut b = gstr(key);
        b.extend(type_id.to_le_bytes());
        b.extend(value);
        self.kvs.push(b);
        self
    }

    fn kv(self, key: &str, type_id: u32, value: &[u8]) -> Raw {
        self.kv_raw(key.as_bytes(), type_id, value)
    }

    fn tensor(mut self, name: &str, dims: &[u64], type_id: u32, offset: u64) -> Raw {
        let mut b = gstr(name.as_bytes());
        b.extend((dims.len() as u32).to_le_bytes());
        for d in dims {
            b.extend(d.to_le_bytes());
        }
        b.extend(type_id.to_le_bytes());
        b.extend(offset.to_le_bytes());
        self.tensors.push(b);
        self
    }

    fn data(mut self, n: usize) -> Raw {
        self.data = n;
        self
    }

    fn no_padding(mut self) -> Raw {
        self.pad = false;
        self
    }

    fn bytes(&self) -> Vec<u8> {
        let mut b = b"GGUF".to_vec();
        b.extend(self.version.to_le_bytes());
        let (nt, nk) = self.counts.unwrap_or((self.tensors.len() as u64, self.kvs.len() as u64));
        b.extend(nt.to_le_bytes());
        b.extend(nk.to_le_bytes());
        self.kvs.iter().for_each(|kv| b.extend(kv));
        self.tensors.iter().for_each(|t| b.extend(t));
        while self.pad && !b.len().is_multiple_of(32) {
            b.push(0);
        }
        b.extend(vec![0u8; self.data]);
        b
    }
}

const U8: u32 = 0;
const U32: u32 = 4;
const I32: u32 = 5;
const BOOL: u32 = 7;
const STRING: u32 = 8;
const ARRAY: u32 = 9;

fn array(elem: u32, n: u64, body: &[u8]) -> Vec<u8> {
    let mut b = elem.to_le_bytes().to_vec();
    b.extend(n.to_le_bytes());
    b.extend(body);
    b
}

/// The synthetic llama model of the tests, rebuilt with its metadata edited and a tensor filter.
fn model_with(edit: impl FnOnce(&mut GgufWriter), keep: impl Fn(&str) -> bool) -> Vec<u8> {
    let base = GgufFile::from_bytes(build(Spec::llama(GgmlType::Q8_0), 11).to_bytes().unwrap()).unwrap();
    let mut w = GgufWriter::new();
    w.copy_metadata(base.metadata());
    edit(&mut w);
    for t in base.tensors() {
        if keep(&t.name) {
            w.add_tensor(&t.name, &t.dims, t.ty, base.tensor_data(t).to_vec()).unwrap();
        }
    }
    w.to_bytes().unwrap()
}

/// The synthetic model with its metadata edited.
fn model_meta(edit: impl FnOnce(&mut GgufWriter)) -> Vec<u8> {
    model_with(edit, |_| true)
}

/// The synthetic model without the keys `drop`.
fn model_without_keys(drop: &[&str]) -> Vec<u8> {
    let base = GgufFile::from_bytes(build(Spec::llama(GgmlType::Q8_0), 11).to_bytes().unwrap()).unwrap();
    let mut w = GgufWriter::new();
    for (k, v) in base.metadata().iter().filter(|(k, _)| !drop.contains(k)) {
        w.set(k, v.clone());
    }
    for t in base.tensors() {
        w.add_tensor(&t.name, &t.dims, t.ty, base.tensor_data(t).to_vec()).unwrap();
    }
    w.to_bytes().unwrap()
}

/// The synthetic model with one tensor's data replaced (same shape and type) or an extra tensor added.
fn model_tensors(edit: impl FnOnce(&mut Vec<(String, Vec<u64>, GgmlType, Vec<u8>)>)) -> Vec<u8> {
    let base = GgufFile::from_bytes(build(Spec::llama(GgmlType::Q8_0), 11).to_bytes().unwrap()).unwrap();
    let mut ts: Vec<_> =
        base.tensors().iter().map(|t| (t.name.clone(), t.dims.clone(), t.ty, base.tensor_data(t).to_vec())).collect();
    edit(&mut ts);
    let mut w = GgufWriter::new();
    w.copy_metadata(base.metadata());
    for (name, dims, ty, data) in ts {
        w.add_tensor(&name, &dims, ty, data).unwrap();
    }
    w.to_bytes().unwrap()
}

fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

#[derive(Clone, Debug)]
enum Expect {
    /// Loading fails with a message containing this (the CLI says it in one line).
    Err(&'static str),
    /// The file parses (the catalogue calls the input valid); a model needs more than it holds.
    Parses,
    /// The whole model loads and runs.
    Runs,
}

struct Case {
    entry: u32,
    what: &'static str,
    bytes: Vec<u8>,
    expect: Expect,
    /// Extra flags for `infer run FILE -p hi -n 1`.
    flags: &'static [&'static str],
}

fn case(entry: u32, what: &'static str, bytes: Vec<u8>, expect: Expect) -> Case {
    Case { entry, what, bytes, expect, flags: &[] }
}

fn cases() -> Vec<Case> {
    use Expect::*;
    let ok_tensor = || Raw::new().tensor("t", &[32, 2], 0, 0).data(256);
    let mut out = vec![
        // A. Header and framing.
        case(
            1,
            "wrong magic",
            Raw::new().bytes().iter().enumerate().map(|(i, b)| if i == 3 { b'L' } else { *b }).collect(),
            Err("not a GGUF file"),
        ),
        case(1, "zero-filled file", vec![0u8; 4096], Err("not a GGUF file")),
        case(2, "four-byte file", b"GGUF".to_vec(), Err("truncated while reading version at offset 4")),
        case(2, "header cut after the tensor count", Raw::new().bytes()[..16].to_vec(), Err("metadata count")),
        case(3, "version 0", Raw::new().version(0).bytes(), Err("GGUF version 0 is not supported")),
        case(3, "version 1", Raw::new().version(1).bytes(), Err("GGUF version 1 is not supported")),
        case(3, "a future version", Raw::new().version(4).bytes(), Err("GGUF version 4 is not supported")),
        case(3, "big-endian file", Raw::new().version(0x0300_0000).bytes(), Err("byte-swapped")),
        case(4, "n_tensors = 2^64-1", Raw::new().counts(u64::MAX, 0).bytes(), Err("n_tensors = 18446744073709551615")),
        case(5, "n_kv = 2^64-1", Raw::new().counts(0, u64::MAX).bytes(), Err("n_kv = 18446744073709551615")),
        // B. Key/value metadata.
        case(
            6,
            "string length 2^64-1",
            Raw::new().kv("k", STRING, &u64::MAX.to_le_bytes()).bytes(),
            Err("string in metadata key 'k' at offset 37: a string of 18446744073709551615 bytes exceeds"),
        ),
        case(
            6,
            "string longer than the file",
            Raw::new().kv("k", STRING, &1000u64.to_le_bytes()).bytes(),
            Err("string in metadata key 'k' at offset 45: needs 1000 bytes"),
        ),
        case(
            6,
            "key length 2^64-1",
            Raw::new()
                .kv_raw(b"", 0, &[])
                .bytes()
                .iter()
                .enumerate()
                .map(|(i, b)| if (24..32).contains(&i) { 0xff } else { *b })
                .collect(),
            Err("metadata key #0"),
        ),
        case(7, "empty key", Raw::new().kv("", U32, &[0; 4]).bytes(), Err("metadata key #0 at offset 24 is empty")),
        case(
            8,
            "non-ASCII key",
            Raw::new().kv("clé", U32, &[0; 4]).bytes(),
            Err("metadata key #0 at offset 24 is not printable ASCII"),
        ),
        case(
            8,
            "invalid UTF-8 in a string value (kept, shown as U+FFFD)",
            Raw::new().kv("general.name", STRING, &gstr(b"\xff\xfe")).bytes(),
            Parses,
        ),
        case(
            9,
            "duplicate key",
            Raw::new().kv("k", U32, &[0; 4]).kv("k", U32, &[1; 4]).bytes(),
            Err("duplicate metadata key 'k'"),
        ),
        case(
            10,
            "value type 13",
            Raw::new().kv("k", 13, &[0; 4]).bytes(),
            Err("metadata key 'k' at offset 33: unknown value type 13"),
        ),
        case(
            10,
            "value type 2^32-1",
            Raw::new().kv("k", u32::MAX, &[0; 4]).bytes(),
            Err("unknown value type 4294967295"),
        ),
        case(
            11,
            "array of 2^62 u32",
            Raw::new().kv("k", ARRAY, &array(U32, 1 << 62, &[])).bytes(),
            Err("array length = 4611686018427387904"),
        ),
        case(
            11,
            "array whose n × size overflows",
            Raw::new().kv("k", ARRAY, &array(10, u64::MAX / 4, &[])).bytes(),
            Err("array length"),
        ),
        case(
            11,
            "a million empty strings (valid: 8 MB of lengths)",
            Raw::new().kv("k", ARRAY, &array(STRING, 1 << 20, &vec![0u8; 8 << 20])).bytes(),
            Parses,
        ),
        case(
            12,
            "array of arrays",
            Raw::new().kv("k", ARRAY, &array(ARRAY, 1, &array(U8, 0, &[]))).bytes(),
            Err("metadata key 'k' at offset 37: arrays of arrays are not supported"),
        ),
        case(
            13,
            "bool byte 2",
            Raw::new().kv("k", BOOL, &[2]).bytes(),
            Err("metadata key 'k' at offset 37: bool byte is 2"),
        ),
        case(
            14,
            "general.alignment as i32",
            Raw::new().kv("general.alignment", I32, &32i32.to_le_bytes()).bytes(),
            Err("general.alignment' has type i32, expected u32"),
        ),
        case(
            14,
            "block_count as a string",
            model_meta(|w| {
                w.set_str("llama.block_count", "2");
            }),
            Err("llama.block_count' has type string"),
        ),
        case(
            14,
            "scores as an i8 array",
            model_meta(|w| {
                w.set("tokenizer.ggml.scores", MetaValue::Array(MetaArray::I8(vec![0; 259])));
            }),
            Err("tokenizer.ggml.scores"),
        ),
        case(
            15,
            "alignment 0",
            Raw::new().kv("general.alignment", U32, &0u32.to_le_bytes()).bytes(),
            Err("general.alignment = 0 is invalid"),
        ),
        case(
            15,
            "alignment 13",
            Raw::new().kv("general.alignment", U32, &13u32.to_le_bytes()).bytes(),
            Err("general.alignment = 13 is invalid"),
        ),
        case(
            15,
            "alignment 2^31",
            Raw::new().kv("general.alignment", U32, &(1u32 << 31).to_le_bytes()).bytes(),
            Err("general.alignment = 2147483648 is invalid"),
        ),
        // C. Tensor-info records.
        case(
            16,
            "65-byte tensor name",
            Raw::new().tensor(&"x".repeat(65), &[32], 0, 0).data(128).bytes(),
            Err("tensor #0 at offset 24: name of 65 bytes is longer than 64"),
        ),
        case(
            17,
            "duplicate tensor name",
            Raw::new().tensor("t", &[32], 0, 0).tensor("t", &[32], 0, 128).data(256).bytes(),
            Err("duplicate tensor name 't'"),
        ),
        case(
            18,
            "five dimensions",
            Raw::new().tensor("t", &[1, 1, 1, 1, 1], 0, 0).data(32).bytes(),
            Err("tensor 't': 5 dimensions"),
        ),
        case(
            18,
            "zero dimensions",
            Raw::new().tensor("t", &[], 0, 0).data(32).bytes(),
            Err("tensor 't': 0 dimensions"),
        ),
        case(
            19,
            "dimension -1",
            Raw::new().tensor("t", &[32, u64::MAX], 0, 0).data(32).bytes(),
            Err("tensor 't': dimension 1 = 18446744073709551615 is invalid"),
        ),
        case(20, "a zero-size dimension (valid)", Raw::new().tensor("t", &[0, 4], 0, 0).bytes(), Parses),
        case(
            21,
            "element count 2^80",
            Raw::new().tensor("t", &[1 << 40, 1 << 40], 0, 0).data(32).bytes(),
            Err("tensor 't': element count of shape [1099511627776, 1099511627776] overflows"),
        ),
        case(
            22,
            "byte size 2^64 (f32 × 2^62)",
            Raw::new().tensor("t", &[1 << 62], 0, 0).data(32).bytes(),
            Err("tensor 't': element count of shape [4611686018427387904] overflows"),
        ),
        case(
            23,
            "offset that pads past 2^64",
            Raw::new().tensor("t", &[32], 0, u64::MAX - 31).data(128).bytes(),
            Err("tensor 't': data ["),
        ),
        case(
            24,
            "sizes whose sum passes 2^64",
            Raw::new().tensor("a", &[1 << 60], 2, 0).tensor("b", &[1 << 60], 2, 1 << 61).data(64).bytes(),
            Err("lies outside the file"),
        ),
        case(
            25,
            "type id 99",
            Raw::new().tensor("t", &[32], 99, 0).data(128).bytes(),
            Err("tensor 't': type unknown ggml type id 99"),
        ),
        case(
            25,
            "type id 2^32-1",
            Raw::new().tensor("t", &[32], u32::MAX, 0).data(128).bytes(),
            Err("unknown ggml type id 4294967295"),
        ),
        case(
            26,
            "removed type 4 (Q4_2)",
            Raw::new().tensor("t", &[32], 4, 0).data(128).bytes(),
            Err("tensor 't': type"),
        ),
        case(26, "removed type 5 (Q4_3)", Raw::new().tensor("t", &[32], 5, 0).data(128).bytes(), Err("removed")),
        case(
            27,
            "row of 33 in Q4_0",
            Raw::new().tensor("t", &[33, 2], 2, 0).data(128).bytes(),
            Err("tensor 't': row length 33 is not a multiple of Q4_0's block size 32"),
        ),
        case(
            28,
            "misaligned offset",
            Raw::new().tensor("t", &[32], 0, 8).data(256).bytes(),
            Err("tensor 't': data offset 8 is not a multiple of the alignment 32"),
        ),
        case(
            28,
            "overlapping tensors",
            Raw::new().tensor("a", &[32], 0, 0).tensor("b", &[32], 0, 64).data(256).bytes(),
            Err("tensors 'a' and 'b' overlap"),
        ),
        case(29, "data one byte short", ok_tensor().data(255).bytes(), Err("tensor 't': data [")),
        case(
            29,
            "data past the end",
            Raw::new().tensor("t", &[32, 2], 0, 4096).data(256).bytes(),
            Err("outside the file"),
        ),
        case(
            30,
            "offset + size wraps",
            Raw::new().tensor("t", &[64], 0, 0u64.wrapping_sub(128)).data(256).bytes(),
            Err("tensor 't': data ["),
        ),
        case(
            31,
            "data section starts past the end",
            Raw::new().tensor("t", &[0], 0, 0).no_padding().bytes(),
            Err("tensor 't': data ["),
        ),
        // D. Model-level metadata.
        case(
            32,
            "block_count 100000",
            model_meta(|w| {
                w.set_u32("llama.block_count", 100_000);
            }),
            Err("metadata key 'llama.block_count' = 100000 is out of range"),
        ),
        case(
            33,
            "head_count 0",
            model_meta(|w| {
                w.set_u32("llama.attention.head_count", 0);
            }),
            Err("metadata key 'llama.attention.head_count' = 0 is out of range"),
        ),
        case(
            33,
            "head_count not a multiple of head_count_kv",
            model_meta(|w| {
                w.set_u32("llama.attention.head_count_kv", 3);
            }),
            Err("metadata key 'llama.attention.head_count_kv' = 3"),
        ),
        case(
            33,
            "odd rope dimension",
            model_meta(|w| {
                w.set_u32("llama.rope.dimension_count", 15);
            }),
            Err("metadata key 'llama.rope.dimension_count' = 15"),
        ),
        case(
            33,
            "rms epsilon NaN",
            model_meta(|w| {
                w.set_f32("llama.attention.layer_norm_rms_epsilon", f32::NAN);
            }),
            Err("metadata key 'llama.attention.layer_norm_rms_epsilon' = NaN"),
        ),
        case(
            33,
            "head_count missing",
            model_without_keys(&["llama.attention.head_count"]),
            Err("missing metadata key 'llama.attention.head_count'"),
        ),
        case(
            34,
            "unsupported rope scaling",
            model_meta(|w| {
                w.set_str("llama.rope.scaling.type", "yarn");
            }),
            Err("metadata key 'llama.rope.scaling.type' = yarn"),
        ),
        Case {
            flags: &["-c", "0"],
            ..case(
                34,
                "context_length 2^64-1 taken by -c 0",
                model_meta(|w| {
                    w.set("llama.context_length", MetaValue::U64(u64::MAX));
                }),
                Err("lower -c"),
            )
        },
        case(
            35,
            "attn_q of the wrong shape",
            model_tensors(|ts| {
                let t = ts.iter_mut().find(|t| t.0 == "blk.0.attn_q.weight").unwrap();
                t.1 = vec![64, 32];
                t.3.truncate(t.3.len() / 2);
            }),
            Err("tensor 'blk.0.attn_q.weight': shape [64, 32], expected [64, 64]"),
        ),
        case(
            35,
            "vocab_size disagreeing with the tokens",
            model_meta(|w| {
                w.set_u32("llama.vocab_size", 300);
            }),
            Err("metadata key 'llama.vocab_size' = 300"),
        ),
        case(
            36,
            "ffn_down missing",
            model_with(|_| {}, |n| n != "blk.1.ffn_down.weight"),
            Err("no tensor named 'blk.1.ffn_down.weight'"),
        ),
        case(
            36,
            "an extra tensor the decoder would ignore",
            model_tensors(|ts| ts.push(("blk.0.attn_q.bias".into(), vec![8], GgmlType::F32, f32_bytes(&[1.0; 8])))),
            Err("tensor 'blk.0.attn_q.bias' is not used by the llama decoder"),
        ),
        case(
            37,
            "a shard of a split model",
            model_meta(|w| {
                w.set("split.count", MetaValue::U16(3));
            }),
            Err("metadata key 'split.count' = 3"),
        ),
        // E. Tokenizer / vocabulary.
        case(
            38,
            "no BOS/EOS ids at all (valid)",
            model_without_keys(&["tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id"]),
            Runs,
        ),
        case(
            39,
            "EOS id past the vocabulary",
            model_meta(|w| {
                w.set_u32("tokenizer.ggml.eos_token_id", 1000);
            }),
            Err("tokenizer.ggml.eos_token_id` = 1000 is not a token id"),
        ),
        case(
            39,
            "BOS id 2^32-1",
            model_meta(|w| {
                w.set_u32("tokenizer.ggml.bos_token_id", u32::MAX);
            }),
            Err("tokenizer.ggml.bos_token_id` = 4294967295"),
        ),
        case(
            40,
            "token_type shorter than tokens",
            model_meta(|w| {
                w.set("tokenizer.ggml.token_type", MetaValue::Array(MetaArray::I32(vec![1; 3])));
            }),
            Err("tokenizer.ggml.token_type` has 3 entries"),
        ),
        case(
            40,
            "scores longer than tokens",
            model_meta(|w| {
                w.set("tokenizer.ggml.scores", MetaValue::Array(MetaArray::F32(vec![0.0; 300])));
            }),
            Err("tokenizer.ggml.scores` has 300 entries"),
        ),
        case(
            41,
            "a 70 KiB token",
            model_meta(|w| {
                let mut t = gpt2_tokens();
                t[5] = "a".repeat(70 << 10);
                w.set("tokenizer.ggml.tokens", MetaValue::Array(MetaArray::String(t.into())));
            }),
            Err("token 5 in `tokenizer.ggml.tokens` is 71680 bytes"),
        ),
        case(42, "byte token <0x-1>", spm_model("<0x-1>"), Err("token 3 is typed as a byte but its text \"<0x-1>\"")),
        case(42, "byte token <0xZZ>", spm_model("<0xZZ>"), Err("\"<0xZZ>\" is not `<0xHH>`")),
        case(42, "byte token <0x+1>", spm_model("<0x+1>"), Err("<0x+1>")),
        case(
            43,
            "a t5 vocabulary with a truncated charsmap",
            model_meta(|w| {
                w.set_str("tokenizer.ggml.model", "t5");
                w.set("tokenizer.ggml.precompiled_charsmap", MetaValue::Array(MetaArray::U8(vec![1, 2, 3])));
            }),
            Err("`tokenizer.ggml.model` = `t5` is not supported"),
        ),
        case(
            44,
            "merges missing",
            model_without_keys(&["tokenizer.ggml.merges"]),
            Err("missing metadata key `tokenizer.ggml.merges`"),
        ),
        case(
            44,
            "a merge without a space",
            model_meta(|w| {
                w.set("tokenizer.ggml.merges", MetaValue::Array(MetaArray::String(StrList::from_iter(["ab"]))));
            }),
            Err("merge #0 in `tokenizer.ggml.merges` is malformed"),
        ),
        case(
            45,
            "unknown pre-tokenizer",
            model_meta(|w| {
                w.set_str("tokenizer.ggml.pre", "nonsense");
            }),
            Err("`tokenizer.ggml.pre` = `nonsense`"),
        ),
        case(
            45,
            "unknown tokenizer model",
            model_meta(|w| {
                w.set_str("tokenizer.ggml.model", "xyz");
            }),
            Err("`tokenizer.ggml.model` = `xyz`"),
        ),
        // F. Chat templates in the file (run with --chat).
        Case {
            flags: &["--chat"],
            ..case(
                46,
                "a template that reads a file",
                template_model("{% include '/etc/passwd' %}"),
                Err("tokenizer.chat_template` failed to render"),
            )
        },
        Case {
            flags: &["--chat"],
            ..case(
                47,
                "a template doubling a string",
                template_model(DOUBLING),
                Err("needed more than 256 MiB of memory"),
            )
        },
        Case {
            flags: &["--chat"],
            ..case(
                47,
                "a template that does not parse",
                template_model("{% for %}"),
                Err("tokenizer.chat_template` does not parse"),
            )
        },
        Case {
            flags: &["--chat"],
            ..case(
                47,
                "a template raising an exception",
                template_model("{{ raise_exception('no') }}"),
                Err("raised an exception: no"),
            )
        },
        // G. Weights.
        case(
            50,
            "a NaN norm weight",
            model_tensors(|ts| {
                let t = ts.iter_mut().find(|t| t.0 == "output_norm.weight").unwrap();
                t.3[..4].copy_from_slice(&f32::NAN.to_le_bytes());
            }),
            Err("output_norm.weight"),
        ),
    ];
    // The valid base file, so the checks above are known to fail for the reason they name.
    out.push(case(0, "the unbroken synthetic model", model_meta(|_| {}), Runs));
    out
}

/// Forty doublings of one character: 2^40 bytes asked for in a few hundred instructions.
const DOUBLING: &str =
    "{% set ns = namespace(s='x') %}{% for i in range(40) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}{{ ns.s|length }}";

fn gpt2_tokens() -> Vec<String> {
    let base = GgufFile::from_bytes(build(Spec::llama(GgmlType::Q8_0), 11).to_bytes().unwrap()).unwrap();
    base.metadata().get_string_array("tokenizer.ggml.tokens").unwrap().to_vec()
}

/// The synthetic model with a SentencePiece vocabulary in which token 3 is typed as a byte and spelled `text`.
fn spm_model(text: &str) -> Vec<u8> {
    let mut tokens = gpt2_tokens();
    tokens[3] = text.to_string();
    let mut types = vec![1i32; tokens.len()];
    types[3] = 6;
    model_meta(|w| {
        w.set_str("tokenizer.ggml.model", "llama")
            .set("tokenizer.ggml.tokens", MetaValue::Array(MetaArray::String(tokens.into())))
            .set("tokenizer.ggml.token_type", MetaValue::Array(MetaArray::I32(types)));
    })
}

fn template_model(template: &str) -> Vec<u8> {
    model_meta(|w| {
        w.set_str("tokenizer.chat_template", template);
    })
}

/// Loads a file the way `infer run --chat` does: the file, the model, the tokenizer, the chat template and one
/// render. `Ok(true)` when all of it worked, `Ok(false)` when only the file parsed (no architecture to load).
fn load_all(bytes: Vec<u8>) -> Result<bool, String> {
    let file = Arc::new(GgufFile::from_bytes(bytes).map_err(|e| e.to_string())?);
    if file.metadata().opt_str("general.architecture").ok().flatten().is_none() {
        return Ok(false);
    }
    let model = Model::from_file(file.clone()).map_err(|e| e.to_string())?;
    let tok = Tokenizer::from_gguf(&file).map_err(|e| e.to_string())?;
    let tmpl = ChatTemplate::from_gguf(&file, None).map_err(|e| e.to_string())?;
    let text = tmpl.render(&[ChatMessage::new("user", "hi")], true).map_err(|e| e.to_string())?;
    let ids = tok.encode_prompt(&text);
    assert!(ids.iter().all(|&i| (i as usize) < model.config.n_vocab));
    Ok(true)
}

/// [`load_all`] on a thread that may hold at most 16 × the file's size + 64 MiB.
fn load_within_budget(bytes: Vec<u8>) -> Result<bool, String> {
    let budget = bytes.len().saturating_mul(16).saturating_add(64 << 20);
    match run_bounded(budget, Duration::from_secs(60), move || load_all(bytes)) {
        Bounded::Done(r) => r,
        other => panic!("loading did not finish within its budget of {budget} bytes: {other:?}"),
    }
}

#[test]
fn every_catalogue_entry_has_a_case_or_a_test() {
    let mut covered: Vec<u32> = cases().iter().map(|c| c.entry).collect();
    // Entries with tests of their own below: 38 (tokenizer level), 46-47 (template sandbox and limits), 48 (one
    // loader for every command), 49 (the writer's output; `infer quantize` is not on this branch yet).
    covered.extend([38, 46, 47, 48, 49]);
    let missing: Vec<u32> = (1..=50).filter(|e| !covered.contains(e)).collect();
    assert!(missing.is_empty(), "catalogue entries without a case: {missing:?}");
}

#[test]
fn the_library_refuses_each_case_by_name_within_a_budget_of_the_file_size() {
    let mut failures = Vec::new();
    for c in cases() {
        let size = c.bytes.len();
        let got = load_within_budget(c.bytes);
        let ok = match (&c.expect, &got) {
            (Expect::Err(needle), Err(e)) => e.contains(needle),
            (Expect::Parses, Ok(_)) => true,
            (Expect::Runs, Ok(true)) => true,
            _ => false,
        };
        // -c 0 and the chat flags are CLI matters: the library has loaded the file itself.
        let cli_only = !c.flags.is_empty() && got.is_ok();
        if !ok && !cli_only {
            failures
                .push(format!("entry {} ({}, {size} bytes): expected {:?}, got {got:?}", c.entry, c.what, c.expect));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn infer_run_refuses_each_case_in_one_line() {
    let dir = tempdir();
    let mut failures = Vec::new();
    for (i, c) in cases().into_iter().enumerate() {
        let path = dir.path().join(format!("case{i}.gguf"));
        std::fs::write(&path, &c.bytes).unwrap();
        let mut args = vec!["run", path.to_str().unwrap(), "-p", "hi", "-n", "1", "--temp", "0"];
        args.extend(c.flags);
        let out = infer(&args);
        let stderr = String::from_utf8_lossy(&out.stderr).to_string();
        let result = std::panic::catch_unwind(|| match c.expect {
            Expect::Err(needle) => assert_clean_failure(&out, needle),
            // A file without an architecture parses but is not a model.
            Expect::Parses => assert_clean_failure(&out, ""),
            Expect::Runs => assert!(out.status.success(), "{stderr}"),
        });
        if result.is_err() {
            failures.push(format!("entry {} ({}): status {:?}, stderr {stderr}", c.entry, c.what, out.status));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// Entry 38: a one-token vocabulary with no special ids at all, where SentencePiece defaults would ask for BOS.
#[test]
fn e38_a_tiny_vocabulary_without_special_ids_tokenizes() {
    for model in ["llama", "gpt2"] {
        let spec = VocabSpec {
            model: model.into(),
            tokens: StrList::from_iter(["a"]),
            merges: Some(StrList::default()),
            ..VocabSpec::default()
        };
        let t = Tokenizer::from_spec(spec).unwrap();
        assert_eq!(t.bos(), None);
        let ids = t.encode("a b ä", true, true);
        assert!(ids.iter().all(|&i| i == 0), "{model}: {ids:?}");
        assert_eq!(t.decode(&[0, 1, u32::MAX]), "a");
    }
}

/// Entry 46: the template engine is a sandbox: no file system, no host objects, no code execution.
#[test]
fn e46_templates_cannot_reach_files_or_host_objects() {
    let conv = [ChatMessage::new("user", "hi")];
    for src in ["{% include '/etc/passwd' %}", "{% import 'os' as os %}", "{% extends '/etc/passwd' %}"] {
        let t = ChatTemplate::new("t", src, "", "").unwrap();
        assert!(t.render(&conv, false).is_err(), "{src}");
    }
    for src in [
        "{{ ''.__class__ }}{{ ''.__class__.__mro__ }}",
        "{{ messages.__init__ }}{{ cycler }}{{ joiner }}{{ self }}",
        "{{ config }}{{ request }}{{ lipsum }}{{ range.__globals__ }}",
    ] {
        let out = ChatTemplate::new("t", src, "", "").unwrap().render(&conv, false).unwrap_or_default();
        assert!(!out.contains("class") && !out.contains("function") && !out.contains("module"), "{src}: {out}");
    }
}

/// Entry 47: every way we know of to make a template use unbounded memory or time is stopped by the render's
/// limits, with an error naming the limit, and the process (this test) lives on.
#[test]
fn e47_hostile_templates_are_stopped_by_the_render_limits() {
    let conv = [ChatMessage::new("user", "hi")];
    let limits = infer::tokenizer::chat::RenderLimits { memory: 32 << 20, time: Duration::from_secs(3) };
    let memory = [
        DOUBLING,
        "{% set ns = namespace(l=[1]) %}{% for i in range(60) %}{% set ns.l = ns.l + ns.l %}{% endfor %}{{ ns.l|length }}",
        "{% set ns = namespace(s='x') %}{% for i in range(60) %}{% set t %}{{ ns.s }}{{ ns.s }}{% endset %}{% set ns.s = t %}{% endfor %}",
        "{{ ([0] * 10000000000)|list|length }}",
        "{{ '%0999999999999d'|format(1) }}",
        "{{ 'x'|indent(100000000000) }}",
        "{% set s = 'x' * 50000000 %}{{ s.replace('x', s)|length }}",
    ];
    for src in memory {
        let t = ChatTemplate::new("t", src, "", "").unwrap().with_limits(limits);
        let e = t.render(&conv, false).unwrap_err().to_string();
        assert!(e.contains("needed more than 32 MiB"), "{src}: {e}");
        // Not run again.
        assert_eq!(t.render(&conv, false).unwrap_err().to_string(), e);
    }
    let slow =
        "{% set s = 'ab' * 5000000 %}{% for i in range(100000) %}{% if s|upper|length > 5 %}{% endif %}{% endfor %}";
    let t = ChatTemplate::new("t", slow, "", "").unwrap().with_limits(limits);
    let e = t.render(&conv, false).unwrap_err().to_string();
    assert!(e.contains("took longer than 3 s"), "{e}");
    // Instruction, recursion and output limits.
    for src in [
        "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
        "{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}",
        "{% macro d(s, n) %}{% if n %}{{ d(s ~ s, n - 1) }}{% endif %}{% endmacro %}{{ d('x', 60) }}",
        "{% for i in range(100000) %}{{ 'x' * 1000 }}{% endfor %}",
    ] {
        assert!(
            ChatTemplate::new("t", src, "", "").unwrap().with_limits(limits).render(&conv, false).is_err(),
            "{src}"
        );
    }
    // An ordinary template still renders under the same small limits.
    let t = ChatTemplate::builtin("chatml", "", "").unwrap().with_limits(limits);
    assert!(t.render(&conv, true).unwrap().ends_with("<|im_start|>assistant\n"));
}

/// Entry 48: every command that opens a GGUF goes through the one validating loader, so each refuses a hostile
/// file with the same message.
#[test]
fn e48_every_command_that_opens_a_model_refuses_the_same_bad_file() {
    let dir = tempdir();
    let path = dir.path().join("bad.gguf");
    std::fs::write(&path, Raw::new().tensor("t", &[32, 2], 0, 4096).data(256).bytes()).unwrap();
    let p = path.to_str().unwrap();
    let commands: [&[&str]; 6] = [
        &["info", p],
        &["tokenize", p, "-p", "hi"],
        &["run", p, "-p", "hi"],
        &["bench", p, "-r", "1", "-p", "8", "-n", "0"],
        &["chat", p],
        &["logits", p],
    ];
    for args in commands {
        let out = crate::common::infer_bin().args(args).stdin(std::process::Stdio::null()).output().unwrap();
        assert_clean_failure(&out, "tensor 't': data [4192, 4448) lies outside the file (352 bytes)");
    }
}

/// Entry 49 (the writer's half): a written file is complete or absent, and reads back through the same strict
/// loader. (`infer quantize`, which refuses to overwrite its input and validates scales, is not on this branch.)
#[test]
fn e49_written_files_are_atomic_and_read_back() {
    let dir = tempdir();
    let target = dir.path().join("out.gguf");
    let w = build(Spec::llama(GgmlType::Q4_0), 3);
    w.write_file(&target).unwrap();
    let leftovers: Vec<_> = std::fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert_eq!(leftovers.len(), 1, "only the finished file remains: {leftovers:?}");
    assert!(load_all(std::fs::read(&target).unwrap()).unwrap());
    // A writer refuses what the reader would refuse.
    let mut w = GgufWriter::new();
    assert!(w.add_tensor("t", &[33], GgmlType::Q4_0, vec![0; 18]).is_err());
    assert!(w.add_tensor(&"x".repeat(65), &[32], GgmlType::F32, vec![0; 128]).is_err());
    assert!(!Path::new(&dir.path().join("never.gguf")).exists());
}
