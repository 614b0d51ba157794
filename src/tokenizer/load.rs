//! Building a [`Tokenizer`] from a GGUF file's `tokenizer.ggml.*` metadata: every array length, token id and token
//! text is checked against the vocabulary before it is used.
//!
//! Clippy's `indexing_slicing`, `arithmetic_side_effects`, `unwrap_used` and `expect_used` are errors here: the
//! metadata is untrusted, and no index or sum derived from it may panic or wrap.
#![deny(clippy::indexing_slicing, clippy::arithmetic_side_effects, clippy::unwrap_used, clippy::expect_used)]

use super::bpe::BpeModel;
use super::special::SpecialMatcher;
use super::spm::SpmModel;
use super::{Model, Pieces, PreTokenizer, TokenType, Tokenizer, TokenizerError, VocabKind, VocabSpec, keys, unicode};
use crate::gguf::{GgufFile, Metadata};

/// Token texts that end generation (llama.cpp's list in `llama_vocab::impl::load`).
const EOG_TEXTS: &[&str] = &[
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<|return|>",
    "<|call|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "<|eom_id|>",
    "<EOT>",
    "_<EOT>",
    "<|end_of_text|>",
    "<end_of_utterance>",
];

/// Token texts that are taken as the end-of-turn token when `tokenizer.ggml.eot_token_id` is absent.
const EOT_TEXTS: &[&str] = &[
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "<|end_of_text|>",
    "<EOT>",
    "_<EOT>",
    "<end_of_utterance>",
];

fn check_id(key: &'static str, id: Option<u32>, n: usize) -> Result<Option<u32>, TokenizerError> {
    match id {
        Some(i) if i as usize >= n => Err(TokenizerError::BadTokenId { key, id: u64::from(i), n_vocab: n }),
        other => Ok(other),
    }
}

/// The byte a `<0xXX>` token text stands for: exactly two hex digits (`from_str_radix` alone would take `<0x+1>`).
pub(crate) fn parse_byte_token(text: &str) -> Option<u8> {
    let hex = text.strip_prefix("<0x")?.strip_suffix('>')?;
    if hex.len() != 2 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    u8::from_str_radix(hex, 16).ok()
}

/// Longest token text accepted (the longest in real vocabularies is a few hundred bytes).
pub const MAX_TOKEN_BYTES: usize = 64 << 10;

impl VocabSpec {
    /// Reads the `tokenizer.ggml.*` keys.
    pub fn from_metadata(md: &Metadata) -> Result<VocabSpec, TokenizerError> {
        // Shares the metadata's buffers: the vocabulary is held once.
        let tokens = md.get_string_array(keys::TOKENS)?.clone();
        let scores = if md.contains(keys::SCORES) { Some(md.get_f32_array(keys::SCORES)?.to_vec()) } else { None };
        let token_types = match md.opt_array(keys::TOKEN_TYPE)? {
            None => None,
            Some(arr) => {
                let mut v = Vec::with_capacity(arr.len());
                for i in 0..arr.len() {
                    let x = arr
                        .get_i64(i)
                        .ok_or(TokenizerError::WrongType { key: keys::TOKEN_TYPE, expected: "array of integers" })?;
                    v.push(i32::try_from(x).unwrap_or(0));
                }
                Some(v)
            }
        };
        let merges = if md.contains(keys::MERGES) { Some(md.get_string_array(keys::MERGES)?.clone()) } else { None };
        Ok(VocabSpec {
            model: md.get_str(keys::MODEL)?.to_string(),
            pre: md.opt_str(keys::PRE)?.map(str::to_string),
            tokens,
            scores,
            token_types,
            merges,
            bos: md.opt_u32(keys::BOS)?,
            eos: md.opt_u32(keys::EOS)?,
            eot: md.opt_u32(keys::EOT)?,
            eom: md.opt_u32(keys::EOM)?,
            unk: md.opt_u32(keys::UNK)?,
            pad: md.opt_u32(keys::PAD)?,
            sep: md.opt_u32(keys::SEP)?,
            add_bos: md.opt_bool(keys::ADD_BOS)?,
            add_eos: md.opt_bool(keys::ADD_EOS)?,
            add_space_prefix: md.opt_bool(keys::ADD_SPACE_PREFIX)?,
        })
    }
}

impl Tokenizer {
    /// Builds the tokenizer a GGUF file describes.
    pub fn from_gguf(file: &GgufFile) -> Result<Tokenizer, TokenizerError> {
        Tokenizer::from_metadata(file.metadata())
    }

    /// Builds the tokenizer from GGUF metadata.
    pub fn from_metadata(md: &Metadata) -> Result<Tokenizer, TokenizerError> {
        Tokenizer::from_spec(VocabSpec::from_metadata(md)?)
    }

    /// Builds a tokenizer from plain vocabulary data.
    pub fn from_spec(spec: VocabSpec) -> Result<Tokenizer, TokenizerError> {
        let n = spec.tokens.len();
        if n == 0 {
            return Err(TokenizerError::EmptyVocab);
        }
        if n >= u32::MAX as usize {
            return Err(TokenizerError::VocabTooLarge(n));
        }
        let kind = match spec.model.as_str() {
            "gpt2" => VocabKind::Bpe,
            "llama" => VocabKind::Spm,
            other => return Err(TokenizerError::UnsupportedModel(other.to_string())),
        };
        let mut types: Vec<TokenType> = match &spec.token_types {
            Some(t) if t.len() != n => {
                return Err(TokenizerError::LengthMismatch {
                    key: "tokenizer.ggml.token_type",
                    got: t.len(),
                    expected: n,
                });
            }
            Some(t) => t.iter().map(|&v| TokenType::from_i32(v)).collect(),
            None => vec![TokenType::Normal; n],
        };
        if let Some(s) = &spec.scores
            && s.len() != n
        {
            return Err(TokenizerError::LengthMismatch { key: "tokenizer.ggml.scores", got: s.len(), expected: n });
        }
        if let Some((id, text)) = spec.tokens.iter().enumerate().find(|(_, t)| t.len() > MAX_TOKEN_BYTES) {
            return Err(TokenizerError::TokenTooLong { id, len: text.len(), limit: MAX_TOKEN_BYTES });
        }
        let bos = check_id("tokenizer.ggml.bos_token_id", spec.bos, n)?;
        let eos = check_id("tokenizer.ggml.eos_token_id", spec.eos, n)?;
        let eot_meta = check_id("tokenizer.ggml.eot_token_id", spec.eot, n)?;
        let eom_meta = check_id("tokenizer.ggml.eom_token_id", spec.eom, n)?;
        let unk = check_id("tokenizer.ggml.unknown_token_id", spec.unk, n)?;
        let pad = check_id("tokenizer.ggml.padding_token_id", spec.pad, n)?;
        let sep = check_id("tokenizer.ggml.seperator_token_id", spec.sep, n)?;
        let tokens = spec.tokens;

        // Tokens that end generation by their text; like llama.cpp, they are treated as control tokens.
        let mut eog: Vec<u32> = Vec::new();
        let mut eot = eot_meta;
        let mut eom = eom_meta;
        // The first token of each `EOT_TEXTS` entry, found in the same pass (a search per entry scanned the whole
        // vocabulary when the file names no EOT token).
        let mut eot_at = [None; EOT_TEXTS.len()];
        for ((id, text), ty) in tokens.iter().enumerate().zip(types.iter_mut()) {
            // Every text looked for here starts with `<` or `_`: most of a 262k vocabulary is skipped at one byte.
            if !text.starts_with(['<', '_']) {
                continue;
            }
            if let Some(slot) = EOT_TEXTS.iter().position(|t| *t == text).and_then(|k| eot_at.get_mut(k))
                && slot.is_none()
            {
                *slot = Some(id as u32);
            }
            if EOG_TEXTS.contains(&text) {
                eog.push(id as u32);
                *ty = TokenType::Control;
            }
            if eom.is_none() && text == "<|eom_id|>" {
                eom = Some(id as u32);
            }
        }
        if eot.is_none() {
            eot = eot_at.into_iter().flatten().next();
        }
        // gpt-oss ("harmony"): `<|end|>` ends a message, not generation, when `<|return|>` and `<|call|>` exist.
        let text_of = |i: u32| tokens.get(i as usize);
        let has = |t: &str| eog.iter().any(|&i| text_of(i) == Some(t));
        if has("<|return|>") && has("<|call|>") {
            eog.retain(|&i| text_of(i) != Some("<|end|>"));
        }
        eog.extend([eos, eot, eom].into_iter().flatten());
        eog.sort_unstable();
        eog.dedup();

        let mergeable: Vec<bool> =
            types.iter().map(|t| !matches!(t, TokenType::Control | TokenType::Unknown | TokenType::Byte)).collect();

        let model = match kind {
            VocabKind::Bpe => {
                let pre_name = spec.pre.clone().unwrap_or_else(|| "default".to_string());
                let pre = PreTokenizer::from_name(&pre_name)
                    .ok_or_else(|| TokenizerError::UnknownPreTokenizer(pre_name.clone()))?;
                let merges = spec.merges.as_ref().ok_or(TokenizerError::MissingKey("tokenizer.ggml.merges"))?;
                Model::Bpe { model: BpeModel::new(&tokens, &mergeable, merges)?, pre }
            }
            VocabKind::Spm => {
                let mut byte_ids = [u32::MAX; 256];
                // `<0xXX>` tokens, those typed as bytes first.
                for want_byte_type in [true, false] {
                    for (id, (text, &ty)) in tokens.iter().zip(&types).enumerate() {
                        if (ty == TokenType::Byte) != want_byte_type {
                            continue;
                        }
                        let byte = parse_byte_token(text);
                        // A token typed as a byte must spell one: anything else is a broken vocabulary, and
                        // guessing what it stands for would decode to the wrong bytes.
                        if ty == TokenType::Byte && byte.is_none() {
                            return Err(TokenizerError::BadByteToken { id, text: text.to_string() });
                        }
                        if let Some(slot) = byte.and_then(|b| byte_ids.get_mut(usize::from(b)))
                            && *slot == u32::MAX
                        {
                            *slot = id as u32;
                        }
                    }
                }
                let scores = spec.scores.unwrap_or_else(|| vec![0.0; n]);
                Model::Spm(SpmModel::new(tokens.clone(), scores, &mergeable, byte_ids))
            }
        };

        // Decoded form of every token (special tokens rendered as their text).
        let byte_table = match &model {
            Model::Spm(m) => Some(m.byte_ids()),
            Model::Bpe { .. } => None,
        };
        // Built into one buffer (no allocation per token); `▁` becomes a space on the way.
        let mut pieces = Pieces::with_capacity(n, tokens.heap_bytes());
        for (id, (text, &t)) in tokens.iter().zip(&types).enumerate() {
            let out = &mut pieces.bytes;
            match (kind, t) {
                (_, TokenType::Control | TokenType::Unknown | TokenType::UserDefined) => {
                    out.extend_from_slice(text.as_bytes())
                }
                (VocabKind::Bpe, TokenType::Normal) => {
                    for c in text.chars() {
                        match unicode::char_to_byte(c) {
                            Some(b) => out.push(b),
                            None => out.extend_from_slice(c.encode_utf8(&mut [0; 4]).as_bytes()),
                        }
                    }
                }
                (VocabKind::Spm, _) => {
                    let table = byte_table.as_ref();
                    match (t, parse_byte_token(text)) {
                        (_, Some(b)) if table.and_then(|tb| tb.get(usize::from(b))) == Some(&(id as u32)) => {
                            out.push(b)
                        }
                        (TokenType::Normal, _) => {
                            // `▁` (E2 96 81) becomes a space; a byte scan, as `str::replace` cost ~600 instructions
                            // a token here.
                            let mut rest = text.as_bytes();
                            while let Some(p) = rest.iter().position(|&b| b == 0xE2) {
                                let (head, tail) = rest.split_at_checked(p).unwrap_or((rest, &[]));
                                out.extend_from_slice(head);
                                if let Some(after) = tail.strip_prefix("\u{2581}".as_bytes()) {
                                    out.push(b' ');
                                    rest = after;
                                } else {
                                    out.extend_from_slice(tail.get(..1).unwrap_or_default());
                                    rest = tail.get(1..).unwrap_or_default();
                                }
                            }
                            out.extend_from_slice(rest);
                        }
                        _ => {}
                    }
                }
                (VocabKind::Bpe, _) => {}
            }
            pieces.end_piece();
        }

        let specials = SpecialMatcher::new(
            tokens
                .iter()
                .zip(&types)
                .enumerate()
                .filter(|(_, (text, ty))| {
                    !text.is_empty() && matches!(ty, TokenType::Control | TokenType::Unknown | TokenType::UserDefined)
                })
                .map(|(id, (text, &ty))| (id as u32, text, ty == TokenType::UserDefined))
                .collect(),
        );

        let (add_bos_default, add_space_default) = match (&model, kind) {
            (Model::Bpe { pre, .. }, _) => (pre.ignore_merges, false),
            (_, VocabKind::Spm) => (true, true),
            _ => (false, false),
        };
        Ok(Tokenizer {
            kind,
            model,
            tokens,
            types,
            pieces,
            specials,
            bos,
            eos,
            eot,
            eom,
            unk,
            pad,
            sep,
            add_bos: spec.add_bos.unwrap_or(add_bos_default),
            add_eos: spec.add_eos.unwrap_or(false),
            add_space_prefix: spec.add_space_prefix.unwrap_or(add_space_default),
            eog,
        })
    }
}

/// A vocabulary's token types and BOS, read from the metadata without building the tokenizer, for a caller that
/// only draws tokens (the quantizer's self-calibration): most of building one is its BPE merge table (~2% of a
/// default `infer quantize` of SmolLM2, on the path before the calibration can start). The types are those
/// [`Tokenizer::token_type`] gives (end-of-generation texts typed as control), and `bos` is what encoding puts
/// first ([`Tokenizer::add_bos`]). The vocabulary is checked as [`Tokenizer::from_spec`] checks it, except that
/// nothing is built from the texts and merges.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenTypes {
    pub types: Vec<TokenType>,
    /// The BOS id, if encoding adds one.
    pub bos: Option<u32>,
}

impl TokenTypes {
    pub fn from_metadata(md: &Metadata) -> Result<TokenTypes, TokenizerError> {
        let tokens = md.get_string_array(keys::TOKENS)?;
        let n = tokens.len();
        if n == 0 {
            return Err(TokenizerError::EmptyVocab);
        }
        if n >= u32::MAX as usize {
            return Err(TokenizerError::VocabTooLarge(n));
        }
        let add_bos_default = match md.get_str(keys::MODEL)? {
            "gpt2" => {
                let name = md.opt_str(keys::PRE)?.unwrap_or("default");
                let pre = PreTokenizer::from_name(name)
                    .ok_or_else(|| TokenizerError::UnknownPreTokenizer(name.to_string()))?;
                if !md.contains(keys::MERGES) {
                    return Err(TokenizerError::MissingKey("tokenizer.ggml.merges"));
                }
                pre.ignore_merges
            }
            "llama" => true,
            other => return Err(TokenizerError::UnsupportedModel(other.to_string())),
        };
        let mut types = match md.opt_array(keys::TOKEN_TYPE)? {
            None => vec![TokenType::Normal; n],
            Some(arr) if arr.len() != n => {
                return Err(TokenizerError::LengthMismatch {
                    key: "tokenizer.ggml.token_type",
                    got: arr.len(),
                    expected: n,
                });
            }
            Some(arr) => (0..n)
                .map(|i| {
                    let v = arr
                        .get_i64(i)
                        .ok_or(TokenizerError::WrongType { key: keys::TOKEN_TYPE, expected: "array of integers" })?;
                    Ok(TokenType::from_i32(i32::try_from(v).unwrap_or(0)))
                })
                .collect::<Result<Vec<_>, TokenizerError>>()?,
        };
        for (ty, text) in types.iter_mut().zip(tokens.iter()) {
            if EOG_TEXTS.contains(&text) {
                *ty = TokenType::Control;
            }
        }
        let bos = check_id("tokenizer.ggml.bos_token_id", md.opt_u32(keys::BOS)?, n)?;
        let add_bos = md.opt_bool(keys::ADD_BOS)?.unwrap_or(add_bos_default);
        Ok(TokenTypes { types, bos: bos.filter(|_| add_bos) })
    }
}
