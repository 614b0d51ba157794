//! Both tokenizers of the registry models (SmolLM2's byte-level BPE, Gemma 3's SentencePiece) on arbitrary text,
//! and the streaming detokenizer on arbitrary token ids, in range or not.
//!
//! The vocabularies are read once from the models in `$INFER_HOME/models` (scripts/fuzz.sh makes sure they are
//! there). Checked: every id is in the vocabulary; what the stream decoder emits, token by token, adds up to the
//! whole-sequence decode; decoding the encoding of text gives the text back wherever the vocabulary can spell it.
#![no_main]

use std::sync::OnceLock;

use infer::gguf::GgufFile;
use infer::tokenizer::Tokenizer;
use libfuzzer_sys::fuzz_target;

fn tokenizers() -> &'static [Tokenizer] {
    static TOKS: OnceLock<Vec<Tokenizer>> = OnceLock::new();
    TOKS.get_or_init(|| {
        let dir = infer::registry::models_dir(&infer::registry::infer_home());
        ["SmolLM2-135M-Instruct.Q4_1.gguf", "gemma-3-270m-q4_k_m.gguf"]
            .iter()
            .map(|f| {
                let file = GgufFile::open(dir.join(f)).unwrap_or_else(|e| panic!("{f}: {e} (run `infer pull` first)"));
                Tokenizer::from_gguf(&file).expect("the registry models' tokenizers load")
            })
            .collect()
    })
}

fuzz_target!(
    // Loaded before fuzzing starts: a full vocabulary load under ASan takes longer than the 1 s a unit may.
    init: {
        tokenizers();
    },
    |data: &[u8]| {
    let Some((&flags, rest)) = data.split_first() else { return };
    let tok = &tokenizers()[usize::from(flags & 1)];
    let (add_special, parse_special, skip_special) = (flags & 2 != 0, flags & 4 != 0, flags & 8 != 0);
    if flags & 16 != 0 {
        // Arbitrary ids through the streaming decoder.
        let ids: Vec<u32> = rest.chunks(3).map(|c| c.iter().fold(0u32, |a, &b| a << 8 | u32::from(b))).collect();
        let mut dec = tok.stream_decoder(skip_special);
        let mut streamed = String::new();
        for &id in &ids {
            streamed.push_str(&dec.push(id));
        }
        streamed.push_str(&dec.finish());
        assert_eq!(streamed, tok.decode_with(&ids, skip_special));
        return;
    }
    let text = String::from_utf8_lossy(rest);
    let ids = tok.encode(&text, add_special, parse_special);
    assert!(ids.iter().all(|&i| (i as usize) < tok.n_vocab()), "id out of range");
    let _ = tok.encode_prompt(&text);
    let back = tok.decode_with(&ids, false);
    // Text the vocabulary can spell comes back unchanged (plain ASCII letters and spaces always can).
    if !add_special && !parse_special && !tok.add_space_prefix() && text.bytes().all(|b| b.is_ascii_alphanumeric() || b == b' ')
    {
        assert_eq!(back, text, "round trip");
    }
});
