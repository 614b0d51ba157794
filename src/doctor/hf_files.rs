//! Comparison with the Hugging Face files a GGUF was converted from: `tokenizer.json` (vocabulary, merges, which
//! added tokens are special) and `tokenizer_config.json` (BOS/EOS, chat template).
//!
//! A converter that misreads these gives a file that loads and runs but tokenizes or stops differently from the
//! original (llama.cpp #3502: BPE that differs from HF's; unsloth #468: the wrong EOS). Only the declarations are
//! compared, which needs no second tokenizer implementation: the same vocabulary, merges and pre-tokenizer give the
//! same tokens.

use std::path::Path;

use serde_json::Value;

use super::{Check, Options, Status};
use crate::gguf::{MetaArray, MetaValue, Metadata};
use crate::tokenizer::{PreTokenizer, TokenType, Tokenizer, VocabKind, keys};

/// Larger JSON files are refused rather than read: the largest published `tokenizer.json` files are tens of MB.
const MAX_JSON_BYTES: u64 = 256 << 20;
/// Examples of each kind of difference a report lists.
const EXAMPLES: usize = 3;

/// The comparisons the options ask for (a skipped check when they name no file).
pub fn check_all(opts: &Options, md: &Metadata, tok: &Tokenizer) -> Vec<Check> {
    let mut out = Vec::new();
    match &opts.tokenizer_json {
        Some(path) => out.push(match read_json(path) {
            Ok(json) => compare_tokenizer(&json, md, tok),
            Err(e) => Check::fail("tokenizer.json", e),
        }),
        None => out.push(Check::skip(
            "tokenizer.json",
            "none beside the model (--tokenizer-json FILE compares the vocabulary with one)",
        )),
    }
    if let Some(path) = &opts.tokenizer_config {
        out.push(match read_json(path) {
            Ok(json) => compare_config(&json, md, tok),
            Err(e) => Check::fail("tokenizer_config.json", e),
        });
    }
    out
}

fn read_json(path: &Path) -> Result<Value, String> {
    let name = path.display();
    let len = std::fs::metadata(path).map_err(|e| format!("cannot read {name}: {e}"))?.len();
    if len > MAX_JSON_BYTES {
        return Err(format!("{name} is {len} bytes, more than the {MAX_JSON_BYTES} a tokenizer file can need"));
    }
    let text = std::fs::read(path).map_err(|e| format!("cannot read {name}: {e}"))?;
    serde_json::from_slice(&text).map_err(|e| format!("{name} is not valid JSON: {e}"))
}

/// A token the JSON names: its text and whether it is marked special.
#[derive(Debug)]
struct HfToken {
    text: String,
    special: bool,
}

/// The vocabulary of a `tokenizer.json`: `model.vocab` (an object of text → id for BPE and WordPiece, or a list of
/// `[text, score]` for Unigram, where the id is the position) plus `added_tokens`, by id.
fn hf_vocab(json: &Value) -> Result<std::collections::BTreeMap<u64, HfToken>, String> {
    let mut out = std::collections::BTreeMap::new();
    match json.pointer("/model/vocab") {
        Some(Value::Object(map)) => {
            for (text, id) in map {
                let id = id.as_u64().ok_or_else(|| format!("model.vocab[{text:?}] is not a token id"))?;
                out.insert(id, HfToken { text: text.clone(), special: false });
            }
        }
        Some(Value::Array(list)) => {
            for (id, entry) in list.iter().enumerate() {
                let text =
                    entry.get(0).and_then(Value::as_str).ok_or_else(|| format!("model.vocab[{id}] has no text"))?;
                out.insert(id as u64, HfToken { text: text.to_string(), special: false });
            }
        }
        _ => return Err("has no model.vocab".into()),
    }
    for (i, t) in json.get("added_tokens").and_then(Value::as_array).into_iter().flatten().enumerate() {
        let id = t.get("id").and_then(Value::as_u64).ok_or_else(|| format!("added_tokens[{i}] has no id"))?;
        let text =
            t.get("content").and_then(Value::as_str).ok_or_else(|| format!("added_tokens[{i}] has no content"))?;
        let special = t.get("special").and_then(Value::as_bool).unwrap_or(false);
        out.insert(id, HfToken { text: text.to_string(), special });
    }
    Ok(out)
}

/// `model.merges` as `"a b"` strings: written either that way or, since 2024, as `["a", "b"]` pairs.
fn hf_merges(json: &Value) -> Option<Vec<String>> {
    let list = json.pointer("/model/merges")?.as_array()?;
    list.iter()
        .map(|m| match m {
            Value::String(s) => Some(s.clone()),
            Value::Array(pair) => match (pair.first()?.as_str(), pair.get(1)?.as_str(), pair.len()) {
                (Some(a), Some(b), 2) => Some(format!("{a} {b}")),
                _ => None,
            },
            _ => None,
        })
        .collect()
}

fn compare_tokenizer(json: &Value, md: &Metadata, tok: &Tokenizer) -> Check {
    let name = "tokenizer.json";
    let vocab = match hf_vocab(json) {
        Ok(v) => v,
        Err(e) => return Check::fail(name, format!("not a tokenizer file: it {e}")),
    };
    let n = tok.n_vocab() as u64;
    let mut status = Status::Ok;
    let mut details = Vec::new();
    let (mut differ, mut beyond) = (Vec::new(), 0usize);
    let mut plain_specials = Vec::new();
    for (&id, t) in &vocab {
        let Some(ours) = u32::try_from(id).ok().filter(|&i| u64::from(i) < n) else {
            beyond += 1;
            continue;
        };
        if tok.token_text(ours) != Some(t.text.as_str()) {
            differ.push(format!("id {id}: {:?} here, {:?} there", tok.token_text(ours).unwrap_or(""), t.text));
        } else if t.special && tok.token_type(ours) == Some(TokenType::Normal) && !tok.is_eog(ours) {
            plain_specials.push(format!("{:?} ({id})", t.text));
        }
    }
    let mut summary = format!("{} tokens there, {n} here", vocab.len());
    if !differ.is_empty() || beyond > 0 {
        status = Status::Fail;
        details.push(format!(
            "{} ids spell another token here and {beyond} ids are past this file's vocabulary: the model would \
             see other tokens than it was trained on",
            differ.len()
        ));
        details.extend(differ.into_iter().take(EXAMPLES));
    } else {
        summary.push_str(", the same text at every id");
        if (vocab.len() as u64) < n {
            details.push(format!("{} more here (padding to the embedding rows, usually)", n - vocab.len() as u64));
        }
    }
    if !plain_specials.is_empty() {
        status = status.max(Status::Warn);
        details.push(format!(
            "{} tokens marked special there are ordinary text here, so prompts spell them out piece by piece: {}",
            plain_specials.len(),
            plain_specials.iter().take(EXAMPLES).cloned().collect::<Vec<_>>().join(", ")
        ));
    }
    if tok.kind() == VocabKind::Bpe
        && let Some(theirs) = hf_merges(json)
    {
        let ours: Vec<&str> = match md.get(keys::MERGES).and_then(MetaValue::as_array) {
            Some(MetaArray::String(list)) => list.iter().collect(),
            _ => Vec::new(),
        };
        match ours.iter().zip(&theirs).position(|(a, b)| a != b) {
            Some(i) => {
                status = Status::Fail;
                details.push(format!("merge {i} differs: {:?} here, {:?} there", ours[i], theirs[i]));
            }
            None if ours.len() != theirs.len() => {
                status = Status::Fail;
                details.push(format!("{} merges here, {} there", ours.len(), theirs.len()));
            }
            None => summary.push_str(&format!("; the same {} merges", ours.len())),
        }
        // Llama 3's BPE keeps a word that is a token whole; a pre-tokenizer that does not disagrees on such words.
        if let Some(ignore) = json.pointer("/model/ignore_merges").and_then(Value::as_bool)
            && let Some(pre) = tok.pre_name().and_then(PreTokenizer::from_name)
            && pre.ignore_merges != ignore
        {
            status = status.max(Status::Warn);
            details.push(format!(
                "model.ignore_merges is {ignore} there, but pre-tokenizer '{}' {} merge whole-token words",
                pre.name,
                if pre.ignore_merges { "does not" } else { "does" }
            ));
        }
    }
    Check::new(name, status, summary).with_details(details)
}

/// A token in `tokenizer_config.json`: a string, or an object with its `content`.
fn config_token(json: &Value, key: &str) -> Option<String> {
    match json.get(key)? {
        Value::String(s) => Some(s.clone()),
        Value::Object(o) => o.get("content").and_then(Value::as_str).map(str::to_string),
        _ => None,
    }
}

/// The default chat template of a `tokenizer_config.json`: a string, or a list of named ones (`default` first).
fn config_template(json: &Value) -> Option<String> {
    match json.get("chat_template")? {
        Value::String(s) => Some(s.clone()),
        Value::Array(list) => {
            let named = |want: &str| {
                list.iter().find(|t| t.get("name").and_then(Value::as_str) == Some(want))?.get("template")?.as_str()
            };
            named("default").or_else(|| list.first()?.get("template")?.as_str()).map(str::to_string)
        }
        _ => None,
    }
}

fn compare_config(json: &Value, md: &Metadata, tok: &Tokenizer) -> Check {
    let name = "tokenizer_config.json";
    let mut status = Status::Ok;
    let mut details = Vec::new();
    let mut said = Vec::new();
    for (key, ours) in [("bos_token", tok.bos()), ("eos_token", tok.eos())] {
        let Some(theirs) = config_token(json, key) else { continue };
        said.push(format!("{key} {theirs:?}"));
        let ours_text = ours.and_then(|id| tok.token_text(id));
        if ours_text == Some(theirs.as_str()) {
            continue;
        }
        // A different EOS still stops generation if this tokenizer ends at it too (instruct models often name
        // the end-of-turn token there and the document end here, or the other way round).
        let stops = tok.token_id(&theirs).is_some_and(|id| tok.is_eog(id));
        if key == "eos_token" && !stops {
            status = Status::Warn;
            details.push(format!(
                "eos_token is {theirs:?} there but {:?} here, and {theirs:?} does not end generation here: \
                 replies may not stop (a wrong tokenizer.ggml.eos_token_id?)",
                ours_text.unwrap_or("none")
            ));
        } else if key == "bos_token" {
            status = status.max(Status::Warn);
            details.push(format!("bos_token is {theirs:?} there but {:?} here", ours_text.unwrap_or("none")));
        }
    }
    let ours = md.opt_str(keys::CHAT_TEMPLATE).ok().flatten();
    match (config_template(json), ours) {
        (Some(_), None) => {
            status = status.max(Status::Warn);
            details.push(
                "it has a chat template and this file has none: the conversion dropped it (pass the template to \
                 --chat-template as a file)"
                    .into(),
            );
        }
        (Some(theirs), Some(ours)) if theirs.trim() != ours.trim() => {
            status = status.max(Status::Warn);
            details.push("its chat template differs from this file's".into());
        }
        (Some(_), Some(_)) => said.push("the same chat template".into()),
        (None, _) => {}
    }
    let summary = if said.is_empty() { "names no special tokens or template".to_string() } else { said.join(", ") };
    Check::new(name, status, summary).with_details(details)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn merges_are_read_in_both_spellings() {
        let strings = json!({"model": {"merges": ["a b", "ab c"]}});
        let pairs = json!({"model": {"merges": [["a", "b"], ["ab", "c"]]}});
        assert_eq!(hf_merges(&strings), Some(vec!["a b".to_string(), "ab c".to_string()]));
        assert_eq!(hf_merges(&pairs), hf_merges(&strings));
        // A pair of three, or a number, is not a merge: the list is unreadable rather than half-read.
        assert_eq!(hf_merges(&json!({"model": {"merges": [["a", "b", "c"]]}})), None);
        assert_eq!(hf_merges(&json!({"model": {"merges": [1]}})), None);
        assert_eq!(hf_merges(&json!({"model": {}})), None);
    }

    #[test]
    fn config_tokens_and_templates_are_read_in_every_shape() {
        let c = json!({
            "bos_token": "<s>",
            "eos_token": {"content": "</s>", "lstrip": false},
            "pad_token": null,
            "chat_template": [{"name": "tool_use", "template": "T"}, {"name": "default", "template": "D"}],
        });
        assert_eq!(config_token(&c, "bos_token").as_deref(), Some("<s>"));
        assert_eq!(config_token(&c, "eos_token").as_deref(), Some("</s>"));
        assert_eq!(config_token(&c, "pad_token"), None);
        assert_eq!(config_template(&c).as_deref(), Some("D"));
        assert_eq!(config_template(&json!({"chat_template": [{"name": "x", "template": "X"}]})).as_deref(), Some("X"));
        assert_eq!(config_template(&json!({"chat_template": "S"})).as_deref(), Some("S"));
    }

    #[test]
    fn unigram_vocabularies_take_ids_from_positions_and_added_tokens_override() {
        let j = json!({
            "model": {"type": "Unigram", "vocab": [["<unk>", 0.0], ["▁a", -1.5]]},
            "added_tokens": [{"id": 2, "content": "<eos>", "special": true}],
        });
        let v = hf_vocab(&j).unwrap();
        let texts: Vec<(u64, &str, bool)> = v.iter().map(|(&id, t)| (id, t.text.as_str(), t.special)).collect();
        assert_eq!(texts, vec![(0, "<unk>", false), (1, "▁a", false), (2, "<eos>", true)]);
        assert!(hf_vocab(&json!({"model": {"vocab": {"a": "x"}}})).unwrap_err().contains("not a token id"));
        assert!(hf_vocab(&json!({"added_tokens": []})).unwrap_err().contains("no model.vocab"));
    }
}
