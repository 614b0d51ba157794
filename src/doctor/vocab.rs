//! Tokenizer checks: the kind and pre-tokenizer, the special and end-of-generation tokens, and a round trip of
//! built-in texts.

use super::Check;
use crate::gguf::Metadata;
use crate::tokenizer::pretokenize::PreTokenizer;
use crate::tokenizer::{TokenType, Tokenizer, VocabKind, keys};

/// The tokenizer checks, in the order a report shows them.
pub fn check_all(md: &Metadata, tok: &Tokenizer) -> Vec<Check> {
    vec![check_tokenizer(md, tok), check_special(tok), check_round_trip(tok)]
}

/// Vocabularies that say which pre-tokenizer they were trained with, by a token only they have and their size.
/// A file whose `tokenizer.ggml.pre` splits text differently from the one named here tokenizes differently from
/// the model's training (llama.cpp #7476: Llama 3 files converted before the pre-tokenizer key existed; #7724: a
/// Llama 3 file tagged `smaug-bpe`, which splits the same way and so passes here). Vocabulary sizes are those of
/// the models' published configurations.
const SIGNATURES: &[Signature] = &[
    Signature { family: "Llama 3", token: "<|begin_of_text|>", min_vocab: 128_000, pre: "llama3" },
    Signature { family: "Qwen 2", token: "<|im_start|>", min_vocab: 151_000, pre: "qwen2" },
];

struct Signature {
    family: &'static str,
    token: &'static str,
    min_vocab: usize,
    /// A pre-tokenizer name that splits as the family does (any name with the same rules passes).
    pre: &'static str,
}

/// Whether two pre-tokenizer names split text the same way.
fn same_split(a: &str, b: &str) -> bool {
    match (PreTokenizer::from_name(a), PreTokenizer::from_name(b)) {
        (Some(a), Some(b)) => a.rules == b.rules && a.ignore_merges == b.ignore_merges,
        _ => false,
    }
}

fn check_tokenizer(md: &Metadata, tok: &Tokenizer) -> Check {
    let n = tok.n_vocab();
    match tok.kind() {
        VocabKind::Spm => {
            // SentencePiece vocabularies spell bytes as `<0xXX>`; without all 256 a character outside the
            // vocabulary becomes the unknown token (or is dropped) instead of its UTF-8 bytes.
            // Distinct bytes: a vocabulary that spells one byte twice still lacks another.
            let mut seen = [false; 256];
            for id in 0..n as u32 {
                if let Some(b) = tok.token_text(id).and_then(crate::tokenizer::parse_byte_token) {
                    seen[usize::from(b)] = true;
                }
            }
            let bytes = seen.iter().filter(|&&s| s).count();
            let summary = format!("SentencePiece (`llama`), {n} tokens, {bytes} of 256 byte tokens");
            if bytes >= 256 {
                Check::ok("tokenizer", summary)
            } else {
                Check::warn("tokenizer", summary).with_details(vec![
                    "without every byte token, text the vocabulary does not cover becomes <unk>: the model cannot \
                     read it (see the round trip)"
                        .into(),
                ])
            }
        }
        VocabKind::Bpe => {
            let merges = md.get(keys::MERGES).and_then(|v| v.as_array()).map_or(0, |a| a.len());
            let declared = md.opt_str(keys::PRE).ok().flatten();
            let pre = tok.pre_name().unwrap_or("default");
            let summary = format!("byte-level BPE (`gpt2`), {n} tokens, {merges} merges, pre-tokenizer '{pre}'");
            let signature = SIGNATURES
                .iter()
                .find(|s| n >= s.min_vocab && tok.token_id(s.token).is_some() && !same_split(s.pre, pre));
            if let Some(s) = signature {
                return Check::fail("tokenizer", summary).with_details(vec![
                    format!(
                        "this is {}'s vocabulary (it has {} and {n} tokens), which is split as '{}' splits, but the \
                         file says '{pre}'{}",
                        s.family,
                        s.token,
                        s.pre,
                        if declared.is_none() { " (by default: it has no tokenizer.ggml.pre)" } else { "" },
                    ),
                    "prompts will be cut into other tokens than the model was trained on, which degrades every \
                     reply (llama.cpp #7476); convert the model again with a current converter"
                        .into(),
                ]);
            }
            match declared {
                None => Check::warn("tokenizer", summary).with_details(vec![
                    "the file has no tokenizer.ggml.pre, so text is split as the oldest converters did ('default'); \
                     files converted since mid-2024 name their pre-tokenizer, and a newer model tokenized this way \
                     may see other tokens than it was trained on"
                        .into(),
                ]),
                Some("default") => Check::warn("tokenizer", summary).with_details(vec![
                    "'default' is what converters write when they do not recognise the tokenizer; if the model is \
                     newer than GPT-2-style BPE, its prompts may be cut into more tokens than in training \
                     (ollama #17698)"
                        .into(),
                ]),
                Some(_) => Check::ok("tokenizer", summary),
            }
        }
    }
}

/// `'<|im_end|>' (2)`: a token for a report.
pub fn describe(tok: &Tokenizer, id: u32) -> String {
    format!("{:?} ({id})", tok.token_text(id).unwrap_or("?"))
}

fn check_special(tok: &Tokenizer) -> Check {
    let name = "special tokens";
    let mut parts = Vec::new();
    let mut details = Vec::new();
    let mut status = super::Status::Ok;
    match tok.bos() {
        Some(b) => parts.push(format!("BOS {}{}", describe(tok, b), if tok.add_bos() { ", added" } else { "" })),
        None => parts.push("no BOS".to_string()),
    }
    match tok.eos() {
        Some(e) => parts.push(format!("EOS {}", describe(tok, e))),
        None => parts.push("no EOS".to_string()),
    }
    let eog: Vec<String> = tok.eog_ids().iter().map(|&id| describe(tok, id)).collect();
    if eog.is_empty() {
        status = super::Status::Fail;
        details.push(
            "no token ends generation (no EOS, no end-of-turn token): replies run until -n or the context is \
             full; give --stop STRING with the text the model ends its turns with"
                .into(),
        );
    } else {
        parts.push(format!("generation ends at {}", eog.join(", ")));
    }
    // An end token the vocabulary calls an ordinary piece of text: a wrong `eos_token_id` is the usual cause, and
    // then generation stops wherever the model writes that text (unsloth #468).
    for &id in tok.eog_ids() {
        if tok.token_type(id) == Some(TokenType::Normal) {
            status = status.max(super::Status::Warn);
            details.push(format!(
                "{} ends generation but is an ordinary token, not a control token: replies stop wherever the model \
                 writes that text (a wrong tokenizer.ggml.eos_token_id?)",
                describe(tok, id)
            ));
        }
    }
    if tok.add_bos() && tok.bos().is_none() {
        status = status.max(super::Status::Warn);
        details.push("tokenizer.ggml.add_bos_token is set but there is no BOS token: none is added".into());
    }
    let mut counts = [0usize; 3];
    for id in 0..tok.n_vocab() as u32 {
        match tok.token_type(id) {
            Some(TokenType::Control) => counts[0] += 1,
            Some(TokenType::UserDefined) => counts[1] += 1,
            Some(TokenType::Unused) => counts[2] += 1,
            _ => {}
        }
    }
    details.push(format!("{} control, {} user-defined, {} unused tokens", counts[0], counts[1], counts[2]));
    super::Check::new(name, status, parts.join("; ")).with_details(details)
}

/// Texts a tokenizer must carry through unchanged: scripts, spacing, digits, emoji (with joiners), code, and
/// special-token spellings typed as plain text (which must stay plain text).
pub const ROUND_TRIP_TEXTS: &[(&str, &str)] = &[
    ("English", "Hello, world! How are you today? I'm fine; thanks."),
    ("spacing", "  two leading spaces,\ttabs\tand\nnew lines\n\n   and trailing   "),
    ("numbers", "3.14159, 1,000,000 and 2026-12-06: 42 + 58 = 100"),
    ("Latin accents", "naïve café, Straße, Øresund, façade, São Paulo"),
    ("Cyrillic", "Съешь же ещё этих мягких французских булок, да выпей чаю."),
    ("Greek", "Ξεσκεπάζω την ψυχοφθόρα βδελυγμία."),
    ("Chinese", "我们在普通的处理器上运行大型语言模型。"),
    ("Japanese", "吾輩は猫である。名前はまだ無い。カタカナ、ひらがな。"),
    ("Korean", "안녕하세요, 세계! 다람쥐 헌 쳇바퀴에 타고파."),
    ("Arabic", "مرحبا بالعالم، كيف حالك اليوم؟"),
    ("Hindi", "नमस्ते दुनिया, आप कैसे हैं?"),
    ("emoji", "Emoji: 👋🌍 🧑‍💻 ✅ 🇫🇷"),
    ("code", "fn main() {\n    let x = vec![1, 2, 3];\n    println!(\"{:?}\", x);\n}\n"),
    ("special text", "<|im_end|> </s> <end_of_turn> <|endoftext|> [INST]"),
];

fn check_round_trip(tok: &Tokenizer) -> Check {
    let name = "round trip";
    let mut lossy = Vec::new();
    let mut broken = Vec::new();
    let mut specials = Vec::new();
    let (mut chars, mut tokens) = (0usize, 0usize);
    let mut rates = Vec::new();
    for &(label, text) in ROUND_TRIP_TEXTS {
        let ids = tok.encode(text, false, false);
        let back = tok.decode(&ids);
        chars += text.chars().count();
        tokens += ids.len();
        rates.push(format!("{label} {:.1}", text.chars().count() as f64 / ids.len().max(1) as f64));
        // Text typed by a user must never become a control token: that is how a prompt forges a turn.
        if let Some(&id) = ids.iter().find(|&&id| tok.token_type(id) == Some(TokenType::Control)) {
            specials.push(format!("{label}: plain text became the control token {}", describe(tok, id)));
        }
        if back == text {
            continue;
        }
        let unknown = tok.unk().is_some_and(|u| ids.contains(&u));
        let at = text.chars().zip(back.chars()).take_while(|(a, b)| a == b).count();
        let line = format!(
            "{label}: {:?} came back as {:?}",
            text.chars().skip(at.saturating_sub(4)).take(16).collect::<String>(),
            back.chars().skip(at.saturating_sub(4)).take(16).collect::<String>(),
        );
        if unknown { lossy.push(line) } else { broken.push(line) }
    }
    let summary = format!(
        "{} texts, {} of them back unchanged; {:.2} characters per token",
        ROUND_TRIP_TEXTS.len(),
        ROUND_TRIP_TEXTS.len() - lossy.len() - broken.len(),
        chars as f64 / tokens.max(1) as f64
    );
    let mut details = Vec::new();
    let status = if !broken.is_empty() || !specials.is_empty() {
        details
            .push("decoding the tokens does not give the text back: the vocabulary or its metadata is broken".into());
        super::Status::Fail
    } else if !lossy.is_empty() {
        details.push("these become <unk>: the model cannot read text in them".into());
        super::Status::Warn
    } else {
        super::Status::Ok
    };
    details.extend(broken);
    details.extend(specials);
    details.extend(lossy);
    details.push(format!("characters per token: {}", rates.join(", ")));
    Check::new(name, status, summary).with_details(details)
}
