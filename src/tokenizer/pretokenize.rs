//! Pre-tokenizers: split text into the words that byte-level BPE merges within.
//!
//! Each `tokenizer.ggml.pre` value names a list of regular expressions that llama.cpp applies one after another: the
//! first splits the text, each later one splits every piece the one before produced, and the text between two
//! matches is kept as a piece of its own. The lists (llama.cpp `src/llama-vocab.cpp`, `llm_tokenizer_bpe`):
//!
//! | pre | rules |
//! |---|---|
//! | `gpt2` (and `gpt-2`, `phi-2`, `mpt`, `olmo`, `jais`, ...) | GPT2 |
//! | `smollm` (and `starcoder`, `refact`, `command-r`, `codeshell`, `exaone`, `minerva-7b`) | `\p{N}`, then GPT2 |
//! | `llama3`, `llama-v3`, `llama-bpe` (and `falcon3`, ...) | LLAMA3 with `\p{N}{1,3}` |
//! | `qwen2` (and `stablelm2`, `deepseek-r1-qwen`, `megrez`) | LLAMA3 with `\p{N}` |
//! | `default` | `[\p{P}\$\+<=>\^~\|]+`, then GPT2, then `\p{N}+`, then `[0-9][0-9][0-9]` |
//!
//! where GPT2 is `'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)` (OpenAI's GPT-2 pattern)
//! and LLAMA3 is `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|
//! \s*[\r\n]+|\s+(?!\S)|\s+` (Meta's Llama 3 `tokenizer.json`). Both are implemented here by hand: at each position the
//! alternatives are tried in order with ordinary backtracking semantics, worked out per alternative below, so the
//! result is exactly the regex's without a regex engine.

use super::unicode::{Class, class, is_punctuation};

/// One splitting rule (one regular expression of a pre-tokenizer's list).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Rule {
    /// OpenAI's GPT-2 pattern.
    Gpt2,
    /// Llama 3's pattern; `max_digits` is 3 for `\p{N}{1,3}` (llama3) or 1 for `\p{N}` (qwen2).
    Llama3 { max_digits: usize },
    /// `\p{N}`: every number character alone.
    EachNumber,
    /// `\p{N}+`.
    NumberRuns,
    /// `[\p{P}\$\+<=>\^~\|]+`.
    PunctRuns,
    /// `[0-9][0-9][0-9]`.
    AsciiDigitTriples,
}

/// A pre-tokenizer: the named list of rules.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PreTokenizer {
    pub name: String,
    pub rules: Vec<Rule>,
    /// Llama 3 style: a word that is a token as a whole is not merged (`ignore_merges`).
    pub ignore_merges: bool,
}

impl PreTokenizer {
    /// The pre-tokenizer a `tokenizer.ggml.pre` value names, or `None` if the value is unknown.
    pub fn from_name(name: &str) -> Option<PreTokenizer> {
        use Rule::*;
        let (rules, ignore_merges) = match name {
            "default" => (vec![PunctRuns, Gpt2, NumberRuns, AsciiDigitTriples], false),
            "gpt2" | "gpt-2" | "phi-2" | "mpt" | "olmo" | "jais" | "trillion" | "exaone4" | "roberta-bpe" => {
                (vec![Gpt2], false)
            }
            "smollm" | "starcoder" | "refact" | "command-r" | "codeshell" | "exaone" | "minerva-7b" => {
                (vec![EachNumber, Gpt2], false)
            }
            "llama3" | "llama-v3" | "llama-bpe" | "falcon3" | "dbrx" | "smaug-bpe" => {
                (vec![Llama3 { max_digits: 3 }], true)
            }
            "qwen2" | "stablelm2" | "deepseek-r1-qwen" | "megrez" => (vec![Llama3 { max_digits: 1 }], false),
            _ => return None,
        };
        Some(PreTokenizer { name: name.to_string(), rules, ignore_merges })
    }

    /// Splits `text` into words, appending their byte ranges to `out` (in order, covering all of `text`).
    pub fn split(&self, text: &str, scratch: &mut SplitScratch, out: &mut Vec<(usize, usize)>) {
        scratch.load(text);
        let n = scratch.chars.len();
        // Pieces as char-index ranges; each rule splits every piece of the previous one.
        let mut pieces = std::mem::take(&mut scratch.pieces);
        let mut next = std::mem::take(&mut scratch.next);
        pieces.clear();
        pieces.push((0, n));
        for &rule in &self.rules {
            next.clear();
            for &(lo, hi) in &pieces {
                split_rule(rule, scratch, lo, hi, &mut next);
            }
            std::mem::swap(&mut pieces, &mut next);
        }
        for &(lo, hi) in &pieces {
            out.push((scratch.offsets[lo], scratch.offsets[hi]));
        }
        scratch.pieces = pieces;
        scratch.next = next;
    }
}

/// Buffers reused across calls, so that splitting allocates nothing once warm.
#[derive(Default)]
pub struct SplitScratch {
    chars: Vec<char>,
    classes: Vec<Class>,
    /// Byte offset of each char, plus one past the end.
    offsets: Vec<usize>,
    pieces: Vec<(usize, usize)>,
    next: Vec<(usize, usize)>,
}

impl SplitScratch {
    fn load(&mut self, text: &str) {
        self.chars.clear();
        self.classes.clear();
        self.offsets.clear();
        for (i, c) in text.char_indices() {
            self.chars.push(c);
            self.classes.push(class(c));
            self.offsets.push(i);
        }
        self.offsets.push(text.len());
    }
}

/// Applies one rule to the chars `lo..hi`: matches and the gaps between them become pieces.
fn split_rule(rule: Rule, s: &SplitScratch, lo: usize, hi: usize, out: &mut Vec<(usize, usize)>) {
    let mut gap_start = lo;
    let mut i = lo;
    while i < hi {
        match match_at(rule, s, i, hi) {
            Some(end) if end > i => {
                if gap_start < i {
                    out.push((gap_start, i));
                }
                out.push((i, end));
                i = end;
                gap_start = end;
            }
            _ => i += 1,
        }
    }
    if gap_start < hi {
        out.push((gap_start, hi));
    }
}

/// End of the run of chars of class `cls` starting at `i` (exclusive), within `..hi`.
#[inline]
fn run_end(s: &SplitScratch, i: usize, hi: usize, cls: Class) -> usize {
    let mut j = i;
    while j < hi && s.classes[j] == cls {
        j += 1;
    }
    j
}

/// Where the rule's match starting exactly at `i` ends, or `None` if it does not match there.
fn match_at(rule: Rule, s: &SplitScratch, i: usize, hi: usize) -> Option<usize> {
    match rule {
        Rule::Gpt2 => gpt2_at(s, i, hi),
        Rule::Llama3 { max_digits } => Some(llama3_at(s, i, hi, max_digits)),
        Rule::EachNumber => (s.classes[i] == Class::Number).then_some(i + 1),
        Rule::NumberRuns => (s.classes[i] == Class::Number).then(|| run_end(s, i, hi, Class::Number)),
        Rule::PunctRuns => {
            let is_p = |c: char| matches!(c, '$' | '+' | '<' | '=' | '>' | '^' | '~' | '|') || is_punctuation(c);
            let mut j = i;
            while j < hi && is_p(s.chars[j]) {
                j += 1;
            }
            (j > i).then_some(j)
        }
        Rule::AsciiDigitTriples => {
            (i + 3 <= hi && s.chars[i..i + 3].iter().all(|c| c.is_ascii_digit())).then_some(i + 3)
        }
    }
}

/// GPT-2: `'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)`.
fn gpt2_at(s: &SplitScratch, i: usize, hi: usize) -> Option<usize> {
    let c = s.chars[i];
    // Contractions, case-sensitive.
    if c == '\'' && i + 1 < hi {
        match s.chars[i + 1] {
            's' | 't' | 'm' | 'd' => return Some(i + 2),
            'r' | 'v' if i + 2 < hi && s.chars[i + 2] == 'e' => return Some(i + 3),
            'l' if i + 2 < hi && s.chars[i + 2] == 'l' => return Some(i + 3),
            _ => {}
        }
    }
    // ` ?X+` for X in letters, numbers, other: an optional U+0020, then a run of one class. A space followed by
    // white space (or by nothing) matches none of the three.
    let start = if c == ' ' && i + 1 < hi && s.classes[i + 1] != Class::Whitespace { i + 1 } else { i };
    let cls = s.classes[start];
    if cls != Class::Whitespace {
        return Some(run_end(s, start, hi, cls));
    }
    // `\s+(?!\S)`: the whole run of white space if it reaches the end, else all but its last char; a single white
    // space char before a non-space does not match (it ends up a piece of its own between two matches).
    let j = run_end(s, i, hi, Class::Whitespace);
    if j == hi {
        Some(j)
    } else if j - i > 1 {
        Some(j - 1)
    } else {
        None
    }
}

/// Llama 3 (and Qwen 2 with `max_digits` 1):
/// `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,max}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|
/// \s+(?!\S)|\s+`. Every char matches one alternative, so this always returns an end past `i`.
fn llama3_at(s: &SplitScratch, i: usize, hi: usize, max_digits: usize) -> usize {
    let c = s.chars[i];
    let cls = s.classes[i];
    if c == '\'' && i + 1 < hi {
        let c1 = s.chars[i + 1].to_ascii_lowercase();
        if matches!(c1, 's' | 't' | 'm' | 'd') {
            return i + 2;
        }
        if i + 2 < hi {
            let c2 = s.chars[i + 2].to_ascii_lowercase();
            if matches!((c1, c2), ('r', 'e') | ('v', 'e') | ('l', 'l')) {
                return i + 3;
            }
        }
    }
    // `[^\r\n\p{L}\p{N}]?\p{L}+`
    if cls == Class::Letter {
        return run_end(s, i, hi, Class::Letter);
    }
    if cls != Class::Number && c != '\r' && c != '\n' && i + 1 < hi && s.classes[i + 1] == Class::Letter {
        return run_end(s, i + 1, hi, Class::Letter);
    }
    // `\p{N}{1,max}`
    if cls == Class::Number {
        return run_end(s, i, hi.min(i + max_digits), Class::Number);
    }
    // ` ?[^\s\p{L}\p{N}]+[\r\n]*`
    let start = if c == ' ' && i + 1 < hi && s.classes[i + 1] == Class::Other { i + 1 } else { i };
    if s.classes[start] == Class::Other {
        let mut j = run_end(s, start, hi, Class::Other);
        while j < hi && matches!(s.chars[j], '\r' | '\n') {
            j += 1;
        }
        return j;
    }
    // Only white space is left.
    let j = run_end(s, i, hi, Class::Whitespace);
    // `\s*[\r\n]+`: up to and including the run's last line break.
    if let Some(p) = (i..j).rev().find(|&p| matches!(s.chars[p], '\r' | '\n')) {
        return p + 1;
    }
    // `\s+(?!\S)`, then `\s+`.
    if j == hi || j - i == 1 { j } else { j - 1 }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn split(pre: &str, text: &str) -> Vec<String> {
        let p = PreTokenizer::from_name(pre).unwrap();
        let mut out = Vec::new();
        p.split(text, &mut SplitScratch::default(), &mut out);
        out.iter().map(|&(a, b)| text[a..b].to_string()).collect()
    }

    #[test]
    fn gpt2_splits() {
        assert_eq!(split("gpt2", "Hello, world!"), ["Hello", ",", " world", "!"]);
        assert_eq!(split("gpt2", "hello   world"), ["hello", "  ", " world"]);
        assert_eq!(split("gpt2", "I'm it's"), ["I", "'m", " it", "'s"]);
        assert_eq!(split("gpt2", "a\nb  "), ["a", "\n", "b", "  "]);
        assert_eq!(split("gpt2", "x \t\ny"), ["x", " \t", "\n", "y"]);
        assert_eq!(split("gpt2", " 123 ...!"), [" 123", " ...!"]);
    }

    #[test]
    fn smollm_splits_digits() {
        assert_eq!(split("smollm", "3.14 + 22"), ["3", ".", "1", "4", " +", " ", "2", "2"]);
    }

    #[test]
    fn llama3_splits() {
        assert_eq!(split("llama3", "Hello, world!"), ["Hello", ",", " world", "!"]);
        assert_eq!(split("llama3", "12345 (hi)\n\n  x"), ["123", "45", " (", "hi", ")\n\n", " ", " x"]);
        assert_eq!(split("llama3", "  \n  x"), ["  \n", " ", " x"]);
        assert_eq!(split("llama3", "I'M"), ["I", "'M"]);
        assert_eq!(split("qwen2", "12a"), ["1", "2", "a"]);
    }

    #[test]
    fn default_splits() {
        assert_eq!(split("default", "12345, ok"), ["123", "45", ",", " ok"]);
    }
}
