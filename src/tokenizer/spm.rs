//! SentencePiece-style BPE with scores (`tokenizer.ggml.model = llama`), with byte fallback.
//!
//! The algorithm (SentencePiece's `bpe_model.cc`, Kudo & Richardson 2018): spaces become `▁` (U+2581), the text
//! starts as its characters, and repeatedly the adjacent pair whose concatenation is a vocabulary piece with the
//! highest score is merged (the leftmost on ties), until no adjacent pair forms a piece. A final symbol that is not a
//! piece (only single characters can be) is written as its UTF-8 bytes with the `<0xXX>` byte tokens, or `unk`.
//! There is no pre-tokenization: a whole text fragment is one sequence. Candidates wait in a binary heap and are
//! checked when popped (a candidate is stale once either side has grown or been absorbed).

use std::cmp::Ordering;
use std::collections::BinaryHeap;

use std::hash::Hasher;

use super::hash::FxHasher;
use crate::gguf::StrList;

const NONE: u32 = u32::MAX;

pub struct SpmModel {
    /// Piece text → id, for the tokens merging may produce (normal, user-defined, unused, undefined).
    pieces: PieceTable,
    scores: Vec<f32>,
    /// The `<0xXX>` token of each byte.
    byte_ids: [u32; 256],
    /// Characters that some piece has right before a `▁` (Gemma's `>▁</`, for one).
    bridges: Vec<char>,
}

/// An open-addressing hash set of token ids, looked up by the token's text in the shared vocabulary. A
/// `HashMap<Box<str>, u32>` held a second copy of every text plus 24 bytes a slot (~20 MB for Gemma 3's 262,144
/// tokens); this holds 4 bytes a slot, at most half full (2 MB).
struct PieceTable {
    texts: StrList,
    /// Token ids (`NONE` = empty), indexed by the top bits of the text's hash, probed linearly.
    slots: Vec<u32>,
    /// 64 − log2(slots.len()).
    shift: u32,
}

impl PieceTable {
    fn new(texts: StrList, n: usize) -> PieceTable {
        let size = n.saturating_mul(2).max(16).next_power_of_two();
        PieceTable { texts, slots: vec![NONE; size], shift: 64 - size.trailing_zeros() }
    }

    #[inline]
    fn home(&self, text: &str) -> usize {
        let mut h = FxHasher::default();
        h.write(text.as_bytes());
        // The multiplicative hash's best-mixed bits are its top ones.
        (h.finish() >> self.shift) as usize
    }

    /// The slot holding `text`'s id, or the empty slot where it would go.
    #[inline]
    fn find(&self, text: &str) -> usize {
        let mask = self.slots.len() - 1;
        let mut i = self.home(text);
        loop {
            let id = self.slots[i];
            if id == NONE || self.texts.get(id as usize) == Some(text) {
                return i;
            }
            i = (i + 1) & mask;
        }
    }

    /// Adds token `id`; a later token with the same text replaces an earlier one (as a map filled in id order).
    /// Fewer than half the slots are ever used, so `find` always ends.
    fn insert(&mut self, id: u32) {
        let Some(text) = self.texts.get(id as usize) else { return };
        let i = self.find(text);
        self.slots[i] = id;
    }

    #[inline]
    fn get(&self, text: &str) -> Option<u32> {
        let id = self.slots[self.find(text)];
        (id != NONE).then_some(id)
    }
}

impl SpmModel {
    /// `tokens`: the vocabulary (shared, not copied). `byte_ids`: the `<0xXX>` token of each byte (`u32::MAX` where
    /// there is none); an ASCII byte without one falls back to the token that is that single character, if any.
    pub fn new(tokens: StrList, scores: Vec<f32>, mergeable: &[bool], mut byte_ids: [u32; 256]) -> SpmModel {
        let mut bridges = Vec::new();
        let mut pieces = PieceTable::new(tokens.clone(), tokens.len());
        for ((id, text), &m) in tokens.iter().enumerate().zip(mergeable) {
            if !m || text.is_empty() {
                continue;
            }
            pieces.insert(id as u32);
            let mut prev = None;
            for c in text.chars() {
                if c == '\u{2581}'
                    && let Some(p) = prev
                    && p != '\u{2581}'
                    && !bridges.contains(&p)
                {
                    bridges.push(p);
                }
                prev = Some(c);
            }
        }
        for (b, slot) in (0..128u8).zip(byte_ids.iter_mut()) {
            if *slot == NONE
                && let Some(id) = pieces.get(char::from(b).encode_utf8(&mut [0; 4]))
            {
                *slot = id;
            }
        }
        SpmModel { pieces, scores, byte_ids, bridges }
    }

    /// The byte ranges `text` (in `▁` spelling) can be cut into that tokenize independently: before a `▁` that
    /// follows a character no piece has right before a `▁`. No piece can span such a cut (it would contain that
    /// character followed by `▁`), so merging never crosses it and the pieces' tokens, concatenated, are the text's.
    pub fn chunks(&self, text: &str, out: &mut Vec<(usize, usize)>) {
        let mut start = 0;
        let mut prev: Option<char> = None;
        for (i, c) in text.char_indices() {
            if c == '\u{2581}'
                && let Some(p) = prev
                && p != '\u{2581}'
                && !self.bridges.contains(&p)
            {
                out.push((start, i));
                start = i;
            }
            prev = Some(c);
        }
        if start < text.len() {
            out.push((start, text.len()));
        }
    }

    /// Bytes held by the tables (the vocabulary's text is shared and not counted here).
    pub fn heap_bytes(&self) -> usize {
        self.pieces.slots.len() * 4 + self.scores.len() * 4
    }

    /// The token each byte falls back to (`u32::MAX` for none).
    pub fn byte_ids(&self) -> [u32; 256] {
        self.byte_ids
    }

    /// The id of a piece (in `▁` spelling).
    pub fn piece_id(&self, text: &str) -> Option<u32> {
        self.pieces.get(text)
    }

    /// Appends the tokens of `text`, whose spaces have already been replaced by `▁`.
    pub fn encode(&self, text: &str, unk: Option<u32>, scratch: &mut SpmScratch, out: &mut Vec<u32>) {
        if text.is_empty() {
            return;
        }
        let syms = &mut scratch.syms;
        let heap = &mut scratch.heap;
        syms.clear();
        heap.clear();
        for (start, c) in text.char_indices() {
            let i = syms.len() as u32;
            syms.push(Sym { start: start as u32, len: c.len_utf8() as u32, prev: i.wrapping_sub(1), next: i + 1 });
        }
        if let Some(last) = syms.last_mut() {
            last.next = NONE;
        }
        if let Some(first) = syms.first_mut() {
            first.prev = NONE;
        }
        for i in 1..syms.len() as u32 {
            self.push_pair(text, syms, heap, i - 1, i);
        }
        while let Some(c) = heap.pop() {
            let (l, r) = (c.left as usize, c.right as usize);
            if syms[l].len == 0 || syms[r].len == 0 || syms[l].len + syms[r].len != c.len || syms[l].next != c.right {
                continue;
            }
            syms[l].len += syms[r].len;
            let rn = syms[r].next;
            syms[l].next = rn;
            syms[r].len = 0;
            if rn != NONE {
                syms[rn as usize].prev = c.left;
            }
            let lp = syms[l].prev;
            if lp != NONE {
                self.push_pair(text, syms, heap, lp, c.left);
            }
            if rn != NONE {
                self.push_pair(text, syms, heap, c.left, rn);
            }
        }
        let mut i = 0u32;
        while i != NONE {
            let s = syms[i as usize];
            let piece = &text[s.start as usize..(s.start + s.len) as usize];
            match self.pieces.get(piece) {
                Some(id) => out.push(id),
                None => {
                    for &b in piece.as_bytes() {
                        let id = self.byte_ids[b as usize];
                        if id != NONE {
                            out.push(id);
                        } else if let Some(u) = unk {
                            out.push(u);
                        }
                    }
                }
            }
            i = s.next;
        }
    }

    #[inline]
    fn push_pair(&self, text: &str, syms: &[Sym], heap: &mut BinaryHeap<Candidate>, left: u32, right: u32) {
        let (ls, rs) = (syms[left as usize], syms[right as usize]);
        let joined = &text[ls.start as usize..(rs.start + rs.len) as usize];
        if let Some(id) = self.pieces.get(joined) {
            let score = self.scores.get(id as usize).copied().unwrap_or(0.0);
            heap.push(Candidate { score, left, right, len: ls.len + rs.len });
        }
    }
}

#[derive(Clone, Copy)]
struct Sym {
    start: u32,
    len: u32,
    prev: u32,
    next: u32,
}

/// A merge waiting in the heap: the highest score pops first, then the leftmost.
#[derive(Clone, Copy)]
struct Candidate {
    score: f32,
    left: u32,
    right: u32,
    len: u32,
}

impl Ord for Candidate {
    fn cmp(&self, other: &Self) -> Ordering {
        self.score
            .total_cmp(&other.score)
            .then_with(|| other.left.cmp(&self.left))
            .then_with(|| other.right.cmp(&self.right))
            .then_with(|| other.len.cmp(&self.len))
    }
}

impl PartialOrd for Candidate {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl PartialEq for Candidate {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}

impl Eq for Candidate {}

#[derive(Default)]
pub struct SpmScratch {
    syms: Vec<Sym>,
    heap: BinaryHeap<Candidate>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn model() -> SpmModel {
        // `b▁` and `>▁<` put `b` and `>` before a `▁`: text must not be cut after them.
        let pieces = ["<unk>", "▁", "a", "b", ">", "<", "▁a", "ab", "▁ab", ">▁<", "▁▁", "b▁", "b▁▁a", "▁b"];
        let tokens: StrList = pieces.iter().collect();
        let scores: Vec<f32> =
            (0..tokens.len()).map(|i| -(i as f32) * 0.5 + if i % 3 == 0 { 3.0 } else { 0.0 }).collect();
        let mut mergeable = vec![true; tokens.len()];
        mergeable[0] = false;
        SpmModel::new(tokens, scores, &mergeable, [NONE; 256])
    }

    proptest! {
        /// Tokenizing the chunks one by one gives the same tokens as tokenizing the whole text.
        #[test]
        fn chunks_tokenize_like_the_whole(text in "[ab<> ]{0,24}") {
            let m = model();
            let text = text.replace(' ', "\u{2581}");
            let mut scratch = SpmScratch::default();
            let mut whole = Vec::new();
            m.encode(&text, Some(0), &mut scratch, &mut whole);
            let mut chunks = Vec::new();
            m.chunks(&text, &mut chunks);
            let mut parts = Vec::new();
            for &(a, b) in &chunks {
                m.encode(&text[a..b], Some(0), &mut scratch, &mut parts);
            }
            prop_assert_eq!(whole, parts);
        }
    }
}
