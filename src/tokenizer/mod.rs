//! Tokenizers built from a GGUF file's `tokenizer.ggml.*` metadata, decoding (whole and streaming), the tokens that
//! end generation, and chat templates.
//!
//! Two vocabulary kinds are supported, as named by `tokenizer.ggml.model`:
//! - `gpt2`: byte-level BPE with a merge list and a pre-tokenizer named by `tokenizer.ggml.pre` ([`bpe`],
//!   [`pretokenize`]);
//! - `llama`: SentencePiece-style BPE with scores and byte fallback ([`spm`]).
//!
//! Encoding first finds special-token text ([`special`]), then tokenizes the text between. The behaviour follows
//! llama.cpp's (`llama_tokenize`), which agrees with Hugging Face `tokenizers` on the models we ship tests for.
//!
//! Round trip: `decode(encode(x, add_special = false, _)) == x` for every string `x` whose bytes all have tokens,
//! for vocabularies without `add_space_prefix`. Byte-level vocabularies may lack some byte tokens (SmolLM2 has none
//! for 0x04, 0x06, 0x13, 0x14, 0x16, 0x1D, 0xC0, 0xC1, 0xF1, 0xF2 and 0xF5..=0xFF); such bytes are left out, as
//! Hugging Face `tokenizers` leaves them out (llama.cpp aborts). With `add_space_prefix` (SentencePiece models that
//! set it), encoding puts a space before the text and after every special token, and decoding removes only the one
//! at the very start, so the round trip holds for text without special-token text in it.
//!
//! Deliberate differences from llama.cpp, all outside what real vocabularies exercise: control, unknown and byte
//! tokens never come out of merging (so `--no-parse-special` can never produce `<start_of_turn>` by merging its
//! characters); merges whose parts or result are not tokens are ignored; an unknown `tokenizer.ggml.pre` is an error
//! rather than a fallback to `default`.

pub mod bpe;
pub mod chat;
mod hash;
mod load;
pub mod pretokenize;
pub mod special;
pub mod spm;
pub mod stream;
pub mod unicode;

use thiserror::Error;

pub use chat::{ChatMessage, ChatTemplate, TemplateError};
pub use load::TokenTypes;
pub(crate) use load::parse_byte_token;
pub use pretokenize::PreTokenizer;
pub use stream::StreamDecoder;

use crate::gguf::StrList;
use bpe::{BpeModel, BpeScratch};
use hash::FxMap;
use special::{Fragment, SpecialMatcher};
use spm::{SpmModel, SpmScratch};

/// What went wrong building a tokenizer from metadata.
#[derive(Debug, Error)]
pub enum TokenizerError {
    #[error("missing metadata key `{0}`")]
    MissingKey(&'static str),
    #[error("metadata key `{key}` has the wrong type (expected {expected})")]
    WrongType { key: &'static str, expected: &'static str },
    #[error("`tokenizer.ggml.model` = `{0}` is not supported (supported: `gpt2`, `llama`)")]
    UnsupportedModel(String),
    #[error(
        "`tokenizer.ggml.pre` = `{0}` is not a known pre-tokenizer (known: default, gpt2, smollm, llama3, llama-bpe, \
         qwen2 and their aliases)"
    )]
    UnknownPreTokenizer(String),
    #[error("`tokenizer.ggml.tokens` is empty")]
    EmptyVocab,
    #[error("`tokenizer.ggml.tokens` has {0} entries, more than token ids can number")]
    VocabTooLarge(usize),
    #[error("`{key}` has {got} entries but `tokenizer.ggml.tokens` has {expected}")]
    LengthMismatch { key: &'static str, got: usize, expected: usize },
    #[error("`{key}` = {id} is not a token id (the vocabulary has {n_vocab} tokens)")]
    BadTokenId { key: &'static str, id: u64, n_vocab: usize },
    #[error("merge #{index} in `tokenizer.ggml.merges` is malformed: {text:?}")]
    BadMerge { index: usize, text: String },
    #[error("token {id} is typed as a byte but its text {text:?} is not `<0xHH>`")]
    BadByteToken { id: usize, text: String },
    #[error("token {id} in `tokenizer.ggml.tokens` is {len} bytes, more than the {limit}-byte limit")]
    TokenTooLong { id: usize, len: usize, limit: usize },
    #[error(transparent)]
    Gguf(#[from] crate::gguf::GgufError),
}

/// A token's type, from `tokenizer.ggml.token_type` (values as llama.cpp's `llama_token_type`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TokenType {
    Undefined,
    Normal,
    Unknown,
    Control,
    UserDefined,
    Unused,
    Byte,
}

impl TokenType {
    pub fn from_i32(v: i32) -> TokenType {
        match v {
            1 => TokenType::Normal,
            2 => TokenType::Unknown,
            3 => TokenType::Control,
            4 => TokenType::UserDefined,
            5 => TokenType::Unused,
            6 => TokenType::Byte,
            _ => TokenType::Undefined,
        }
    }
}

/// The vocabulary kind.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum VocabKind {
    /// `gpt2`: byte-level BPE.
    Bpe,
    /// `llama`: SentencePiece BPE with scores.
    Spm,
}

/// Everything the tokenizer is built from, as plain data (what `tokenizer.ggml.*` holds).
#[derive(Clone, Debug, Default)]
pub struct VocabSpec {
    /// `tokenizer.ggml.model`.
    pub model: String,
    /// `tokenizer.ggml.pre`.
    pub pre: Option<String>,
    pub tokens: StrList,
    pub scores: Option<Vec<f32>>,
    pub token_types: Option<Vec<i32>>,
    pub merges: Option<StrList>,
    pub bos: Option<u32>,
    pub eos: Option<u32>,
    pub eot: Option<u32>,
    pub eom: Option<u32>,
    pub unk: Option<u32>,
    pub pad: Option<u32>,
    pub sep: Option<u32>,
    pub add_bos: Option<bool>,
    pub add_eos: Option<bool>,
    pub add_space_prefix: Option<bool>,
}

enum Model {
    Bpe { model: BpeModel, pre: PreTokenizer },
    Spm(SpmModel),
}

/// Words longer than this are not cached (long words are rare and unlikely to repeat).
const WORD_CACHE_MAX_LEN: usize = 64;
/// Distinct words cached per `encode` call.
const WORD_CACHE_MAX_ENTRIES: usize = 1 << 17;

/// A tokenizer: text ↔ token ids.
pub struct Tokenizer {
    kind: VocabKind,
    model: Model,
    /// The vocabulary's texts, shared with the file's metadata (cloning a [`StrList`] shares its buffers).
    tokens: StrList,
    types: Vec<TokenType>,
    /// What each token decodes to with special tokens rendered.
    pieces: Pieces,
    specials: SpecialMatcher,
    bos: Option<u32>,
    eos: Option<u32>,
    eot: Option<u32>,
    eom: Option<u32>,
    unk: Option<u32>,
    pad: Option<u32>,
    sep: Option<u32>,
    add_bos: bool,
    add_eos: bool,
    add_space_prefix: bool,
    eog: Vec<u32>,
}

/// What each token decodes to, as one byte buffer plus end offsets (a `Box<[u8]>` per token cost 16 bytes of
/// header and an allocation each: ~12 MB for Gemma 3's 262,144 tokens).
#[derive(Default)]
struct Pieces {
    bytes: Vec<u8>,
    ends: Vec<u32>,
}

impl Pieces {
    fn with_capacity(n: usize, bytes: usize) -> Pieces {
        Pieces { bytes: Vec::with_capacity(bytes), ends: Vec::with_capacity(n) }
    }

    /// Closes the piece made of the bytes pushed since the last one. The vocabulary's text is under 4 GiB (a
    /// [`StrList`]) and no piece is longer than its token's text, so the offset fits.
    fn end_piece(&mut self) {
        self.ends.push(u32::try_from(self.bytes.len()).unwrap_or(u32::MAX));
    }

    fn get(&self, i: usize) -> Option<&[u8]> {
        let end = *self.ends.get(i)? as usize;
        let start = if i == 0 { 0 } else { *self.ends.get(i - 1)? as usize };
        self.bytes.get(start..end)
    }
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokenizer")
            .field("kind", &self.kind)
            .field("n_vocab", &self.tokens.len())
            .field("pre", &self.pre_name())
            .field("bos", &self.bos)
            .field("eos", &self.eos)
            .field("add_bos", &self.add_bos)
            .finish_non_exhaustive()
    }
}

impl Tokenizer {
    /// Tokenizes `text`. `add_special` adds BOS (and EOS) as the model's metadata asks; `parse_special` turns
    /// control-token text such as `<|im_start|>` into its token (user-defined tokens are always recognised).
    pub fn encode(&self, text: &str, add_special: bool, parse_special: bool) -> Vec<u32> {
        let mut out = Vec::with_capacity(text.len() / 3 + 2);
        if add_special
            && self.add_bos
            && let Some(b) = self.bos
        {
            out.push(b);
        }
        let mut frags = Vec::new();
        self.specials.partition(text, parse_special, &mut frags);
        match &self.model {
            Model::Bpe { model, pre } => {
                let mut split = pretokenize::SplitScratch::default();
                let mut scratch = BpeScratch::default();
                let mut words = Vec::new();
                // Words repeat: remember each distinct word's tokens for the rest of this call (keys borrow the
                // input, values are ranges of one arena).
                let mut cache: FxMap<&[u8], (u32, u32)> = FxMap::default();
                let mut arena: Vec<u32> = Vec::new();
                for f in &frags {
                    match *f {
                        Fragment::Token(id) => out.push(id),
                        Fragment::Text(a, b) => {
                            let t = &text[a..b];
                            words.clear();
                            pre.split(t, &mut split, &mut words);
                            for &(wa, wb) in &words {
                                let word = &t.as_bytes()[wa..wb];
                                if word.len() < 2 || word.len() > WORD_CACHE_MAX_LEN {
                                    model.encode_word(word, pre.ignore_merges, &mut scratch, &mut out);
                                    continue;
                                }
                                if let Some(&(start, len)) = cache.get(word) {
                                    out.extend_from_slice(&arena[start as usize..(start + len) as usize]);
                                    continue;
                                }
                                let before = out.len();
                                model.encode_word(word, pre.ignore_merges, &mut scratch, &mut out);
                                if cache.len() < WORD_CACHE_MAX_ENTRIES && arena.len() < u32::MAX as usize / 2 {
                                    let start = arena.len() as u32;
                                    arena.extend_from_slice(&out[before..]);
                                    cache.insert(word, (start, (out.len() - before) as u32));
                                }
                            }
                        }
                    }
                }
            }
            Model::Spm(model) => {
                let mut scratch = SpmScratch::default();
                let mut buf = String::new();
                let mut prev_special = true;
                let mut chunks: Vec<(usize, usize)> = Vec::new();
                let mut cache: FxMap<Box<str>, (u32, u32)> = FxMap::default();
                let mut arena: Vec<u32> = Vec::new();
                for f in &frags {
                    match *f {
                        Fragment::Token(id) => {
                            out.push(id);
                            prev_special = true;
                        }
                        Fragment::Text(a, b) => {
                            buf.clear();
                            if self.add_space_prefix && prev_special {
                                buf.push('\u{2581}');
                            }
                            for c in text[a..b].chars() {
                                buf.push(if c == ' ' { '\u{2581}' } else { c });
                            }
                            chunks.clear();
                            model.chunks(&buf, &mut chunks);
                            for &(ca, cb) in &chunks {
                                let chunk = &buf[ca..cb];
                                if let Some(&(start, len)) = cache.get(chunk) {
                                    out.extend_from_slice(&arena[start as usize..(start + len) as usize]);
                                    continue;
                                }
                                let before = out.len();
                                // Symbol offsets are 32-bit: a chunk past 1 GiB is tokenized in pieces cut at
                                // character boundaries.
                                let mut rest = chunk;
                                while !rest.is_empty() {
                                    let mut cut = rest.len().min(1 << 30);
                                    while !rest.is_char_boundary(cut) {
                                        cut -= 1;
                                    }
                                    model.encode(&rest[..cut], self.unk, &mut scratch, &mut out);
                                    rest = &rest[cut..];
                                }
                                if chunk.len() <= WORD_CACHE_MAX_LEN
                                    && cache.len() < WORD_CACHE_MAX_ENTRIES
                                    && arena.len() < u32::MAX as usize / 2
                                {
                                    let start = arena.len() as u32;
                                    arena.extend_from_slice(&out[before..]);
                                    cache.insert(chunk.into(), (start, (out.len() - before) as u32));
                                }
                            }
                            prev_special = false;
                        }
                    }
                }
            }
        }
        if add_special
            && self.add_eos
            && let Some(e) = self.eos
        {
            out.push(e);
        }
        out
    }

    /// Tokenizes a rendered chat prompt: special-token text is parsed, and BOS is added as the model asks unless
    /// the text already starts with it (Gemma's template writes `{{ bos_token }}` itself), so there is never a
    /// doubled BOS.
    pub fn encode_prompt(&self, rendered: &str) -> Vec<u32> {
        let mut ids = self.encode(rendered, false, true);
        if let Some(b) = self.bos
            && self.add_bos
            && ids.first() != Some(&b)
        {
            ids.insert(0, b);
        }
        ids
    }

    /// The bytes one token decodes to. Out-of-range ids decode to nothing.
    pub fn token_bytes(&self, id: u32, skip_special: bool) -> &[u8] {
        let Some(p) = self.pieces.get(id as usize) else { return &[] };
        if skip_special && matches!(self.types[id as usize], TokenType::Control | TokenType::Unknown) {
            return &[];
        }
        p
    }

    /// The bytes a token contributes at a position in a decoded sequence (the first token loses the space prefix).
    pub(crate) fn piece_for_decode(&self, id: u32, skip_special: bool, first: bool) -> &[u8] {
        let p = self.token_bytes(id, skip_special);
        if first && self.add_space_prefix && p.first() == Some(&b' ') { &p[1..] } else { p }
    }

    /// Decodes ids to bytes (which may not be valid UTF-8 when the ids split a character).
    pub fn decode_bytes(&self, ids: &[u32], skip_special: bool) -> Vec<u8> {
        let mut out = Vec::new();
        for (i, &id) in ids.iter().enumerate() {
            out.extend_from_slice(self.piece_for_decode(id, skip_special, i == 0));
        }
        out
    }

    /// Decodes ids to text; bytes that do not form UTF-8 become U+FFFD (as `String::from_utf8_lossy`).
    pub fn decode_with(&self, ids: &[u32], skip_special: bool) -> String {
        String::from_utf8_lossy(&self.decode_bytes(ids, skip_special)).into_owned()
    }

    /// Decodes ids to text, special tokens rendered as their text.
    pub fn decode(&self, ids: &[u32]) -> String {
        self.decode_with(ids, false)
    }

    /// A decoder to feed one token at a time.
    pub fn stream_decoder(&self, skip_special: bool) -> StreamDecoder<'_> {
        StreamDecoder::new(self, skip_special)
    }

    /// Whether `id` ends generation.
    pub fn is_eog(&self, id: u32) -> bool {
        self.eog.binary_search(&id).is_ok()
    }

    /// Every token that ends generation (EOS, EOT, EOM and tokens such as `<|im_end|>`, `<end_of_turn>`), sorted.
    pub fn eog_ids(&self) -> &[u32] {
        &self.eog
    }

    pub fn n_vocab(&self) -> usize {
        self.tokens.len()
    }

    /// Bytes of the vocabulary's text (shared with the file's metadata) and of the tokenizer's own tables: decoded
    /// pieces, token types, merge or piece tables, special-token matchers. Approximate (allocator overhead is not
    /// counted), for `run -v`'s memory line.
    pub fn heap_bytes(&self) -> (usize, usize) {
        let model = match &self.model {
            Model::Bpe { model, .. } => model.heap_bytes(),
            Model::Spm(m) => m.heap_bytes(),
        };
        let own = self.pieces.bytes.capacity() + self.pieces.ends.capacity() * 4 + self.types.len() + model;
        (self.tokens.heap_bytes(), own + self.specials.heap_bytes())
    }

    pub fn kind(&self) -> VocabKind {
        self.kind
    }

    /// The pre-tokenizer's name (byte-level BPE only).
    pub fn pre_name(&self) -> Option<&str> {
        match &self.model {
            Model::Bpe { pre, .. } => Some(&pre.name),
            Model::Spm(_) => None,
        }
    }

    /// A token's text as stored in the vocabulary.
    pub fn token_text(&self, id: u32) -> Option<&str> {
        self.tokens.get(id as usize)
    }

    pub fn token_type(&self, id: u32) -> Option<TokenType> {
        self.types.get(id as usize).copied()
    }

    /// The id of a token by its exact vocabulary text.
    pub fn token_id(&self, text: &str) -> Option<u32> {
        self.tokens.position(text).map(|i| i as u32)
    }

    pub fn bos(&self) -> Option<u32> {
        self.bos
    }
    pub fn eos(&self) -> Option<u32> {
        self.eos
    }
    pub fn eot(&self) -> Option<u32> {
        self.eot
    }
    pub fn eom(&self) -> Option<u32> {
        self.eom
    }
    pub fn unk(&self) -> Option<u32> {
        self.unk
    }
    pub fn pad(&self) -> Option<u32> {
        self.pad
    }
    pub fn sep(&self) -> Option<u32> {
        self.sep
    }
    /// Whether encoding with `add_special` puts BOS first.
    pub fn add_bos(&self) -> bool {
        self.add_bos && self.bos.is_some()
    }
    pub fn add_eos(&self) -> bool {
        self.add_eos && self.eos.is_some()
    }
    pub fn add_space_prefix(&self) -> bool {
        self.add_space_prefix
    }

    /// The id → bytes table for the vocabulary's merges (for tests and tools): the BPE token for some raw bytes.
    pub fn bpe_id_of_bytes(&self, bytes: &[u8]) -> Option<u32> {
        match &self.model {
            Model::Bpe { model, .. } => model.id_of_bytes(bytes),
            Model::Spm(_) => None,
        }
    }
}

/// Keys read from the file.
pub mod keys {
    pub const MODEL: &str = "tokenizer.ggml.model";
    pub const PRE: &str = "tokenizer.ggml.pre";
    pub const TOKENS: &str = "tokenizer.ggml.tokens";
    pub const SCORES: &str = "tokenizer.ggml.scores";
    pub const TOKEN_TYPE: &str = "tokenizer.ggml.token_type";
    pub const MERGES: &str = "tokenizer.ggml.merges";
    pub const BOS: &str = "tokenizer.ggml.bos_token_id";
    pub const EOS: &str = "tokenizer.ggml.eos_token_id";
    pub const EOT: &str = "tokenizer.ggml.eot_token_id";
    pub const EOM: &str = "tokenizer.ggml.eom_token_id";
    pub const UNK: &str = "tokenizer.ggml.unknown_token_id";
    pub const PAD: &str = "tokenizer.ggml.padding_token_id";
    pub const SEP: &str = "tokenizer.ggml.seperator_token_id";
    pub const ADD_BOS: &str = "tokenizer.ggml.add_bos_token";
    pub const ADD_EOS: &str = "tokenizer.ggml.add_eos_token";
    pub const ADD_SPACE_PREFIX: &str = "tokenizer.ggml.add_space_prefix";
    pub const CHAT_TEMPLATE: &str = "tokenizer.chat_template";
    pub const ARCHITECTURE: &str = "general.architecture";
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A byte-level vocabulary: the 256 byte characters, then `ab`, `abc`, ` a`, and a control token.
    fn spec() -> VocabSpec {
        let table = unicode::byte_to_char_table();
        let mut tokens: Vec<String> = table.iter().map(|c| c.to_string()).collect();
        tokens.extend(["ab".to_string(), "abc".to_string(), "Ġa".to_string(), "<|end|>".to_string()]);
        let mut types = vec![1; tokens.len()];
        *types.last_mut().unwrap() = 3;
        VocabSpec {
            model: "gpt2".into(),
            pre: Some("gpt2".into()),
            token_types: Some(types),
            merges: Some(StrList::from_iter(["a b", "ab c", "Ġ a"])),
            tokens: tokens.into(),
            eos: Some(259),
            ..VocabSpec::default()
        }
    }

    #[test]
    fn tiny_bpe() {
        let t = Tokenizer::from_spec(spec()).unwrap();
        // " ab": `a b` (rank 0) wins over `Ġ a` (rank 2), leaving the space alone.
        assert_eq!(t.encode("abc ab<|end|>", false, true), [257, 32, 256, 259]);
        assert_eq!(t.encode(" a", false, true), [258]);
        assert_eq!(t.decode(&t.encode("abc ab<|end|>", false, true)), "abc ab<|end|>");
        assert!(t.is_eog(259));
    }

    #[test]
    fn bad_metadata_is_a_typed_error() {
        let mut s = spec();
        s.pre = Some("nonsense".into());
        assert!(matches!(Tokenizer::from_spec(s), Err(TokenizerError::UnknownPreTokenizer(p)) if p == "nonsense"));
        let mut s = spec();
        s.bos = Some(1_000_000);
        let e = Tokenizer::from_spec(s).unwrap_err();
        assert!(e.to_string().contains("tokenizer.ggml.bos_token_id") && e.to_string().contains("1000000"), "{e}");
        let mut s = spec();
        s.token_types = Some(vec![1; 3]);
        assert!(matches!(Tokenizer::from_spec(s), Err(TokenizerError::LengthMismatch { .. })));
        let mut s = spec();
        s.merges = Some(StrList::from_iter(["nospace"]));
        assert!(matches!(Tokenizer::from_spec(s), Err(TokenizerError::BadMerge { index: 0, .. })));
        let mut s = spec();
        s.merges = None;
        assert!(matches!(Tokenizer::from_spec(s), Err(TokenizerError::MissingKey("tokenizer.ggml.merges"))));
        let mut s = spec();
        s.model = "t5".into();
        assert!(matches!(Tokenizer::from_spec(s), Err(TokenizerError::UnsupportedModel(_))));
        assert!(matches!(Tokenizer::from_spec(VocabSpec::default()), Err(TokenizerError::EmptyVocab)));
    }

    #[test]
    fn hostile_vocab_does_not_panic() {
        // Duplicate and empty tokens, merges naming unknown pieces, no byte tokens at all.
        let spec = VocabSpec {
            model: "gpt2".into(),
            pre: Some("smollm".into()),
            tokens: StrList::from_iter(["", "a", "a", "<0x41>"]),
            merges: Some(StrList::from_iter(["a a", "x y", "é ü"])),
            unk: Some(0),
            ..VocabSpec::default()
        };
        let t = Tokenizer::from_spec(spec).unwrap();
        let ids = t.encode("aaé 1 <0x41>", true, true);
        assert!(ids.iter().all(|&i| (i as usize) < 4));
        let _ = t.decode(&[0, 1, 2, 3, 99]);
        let spm = VocabSpec {
            model: "llama".into(),
            tokens: StrList::from_iter(["<unk>", "▁", "a"]),
            scores: Some(vec![0.0, f32::NAN, -1.0]),
            unk: Some(0),
            ..VocabSpec::default()
        };
        let t = Tokenizer::from_spec(spm).unwrap();
        assert_eq!(t.encode("a b", true, true), [1, 2, 1, 0]);
    }
}
