//! Byte-level BPE (GPT-2 style, `tokenizer.ggml.model = gpt2`).
//!
//! The algorithm (Sennrich et al. 2016, as used by GPT-2): a word starts as its bytes; repeatedly, of all adjacent
//! pairs that the merge list holds, the one with the lowest rank (earliest in `tokenizer.ggml.merges`) is merged,
//! the leftmost if it occurs more than once; the remaining symbols are the tokens.
//!
//! Tokens in the vocabulary are spelled in GPT-2's byte ↔ character mapping (`Ġ` for a space byte); they are turned
//! back into bytes once at load, so encoding works on raw bytes. Merges are a map from a pair of token ids to the
//! (rank, merged id), candidates wait in a binary heap keyed by (rank, position) and are checked when popped, so a
//! merge costs a heap operation and no allocation.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use super::TokenizerError;
use super::hash::FxMap;
use super::unicode::char_to_byte;
use crate::gguf::StrList;

const NONE: u32 = u32::MAX;

/// The merge tables of a byte-level BPE vocabulary.
pub struct BpeModel {
    /// Token id of each single byte.
    byte_ids: [u32; 256],
    /// (left id, right id) → (rank, merged id).
    merges: FxMap<u64, (u32, u32)>,
    /// Token bytes → id, for `ignore_merges` (a whole word that is a token is taken as it is).
    bytes_to_id: FxMap<Box<[u8]>, u32>,
}

/// The bytes a byte-level token text stands for, or `None` if a char is outside the mapping (special tokens such as
/// `<|im_start|>` are plain ASCII and map to themselves; a token with, say, a literal space does not).
pub fn token_text_to_bytes(text: &str) -> Option<Vec<u8>> {
    text.chars().map(char_to_byte).collect()
}

impl BpeModel {
    /// Builds the tables. `mergeable[i]` says whether token `i` takes part in merging (normal and user-defined tokens;
    /// control tokens do not, so their text never comes out of merging).
    #[deny(clippy::indexing_slicing, clippy::arithmetic_side_effects, clippy::unwrap_used, clippy::expect_used)]
    pub fn new(tokens: &StrList, mergeable: &[bool], merges: &StrList) -> Result<BpeModel, TokenizerError> {
        let mut bytes_to_id: FxMap<Box<[u8]>, u32> = FxMap::default();
        bytes_to_id.reserve(tokens.len());
        for ((id, text), &m) in tokens.iter().enumerate().zip(mergeable) {
            if !m {
                continue;
            }
            if let Some(bytes) = token_text_to_bytes(text)
                && !bytes.is_empty()
            {
                // As in a map filled in id order: a later duplicate replaces an earlier one.
                bytes_to_id.insert(bytes.into_boxed_slice(), id as u32);
            }
        }
        let mut byte_ids = [NONE; 256];
        for (b, slot) in (0..=255u8).zip(byte_ids.iter_mut()) {
            if let Some(&id) = bytes_to_id.get(&[b][..]) {
                *slot = id;
            }
        }
        let mut table: FxMap<u64, (u32, u32)> = FxMap::default();
        table.reserve(merges.len());
        let mut joined = Vec::new();
        for (rank, merge) in merges.iter().enumerate() {
            // "left right", split at the first space after the first char (a left part never holds a space: the
            // byte-level alphabet has none).
            let split = merge.char_indices().skip(1).find(|&(_, c)| c == ' ').and_then(|(at, _)| {
                let (left, rest) = merge.split_at_checked(at)?;
                Some((left, rest.strip_prefix(' ')?))
            });
            let Some((left, right)) = split else {
                return Err(TokenizerError::BadMerge { index: rank, text: merge.to_string() });
            };
            let (Some(lb), Some(rb)) = (token_text_to_bytes(left), token_text_to_bytes(right)) else {
                return Err(TokenizerError::BadMerge { index: rank, text: merge.to_string() });
            };
            if lb.is_empty() || rb.is_empty() {
                return Err(TokenizerError::BadMerge { index: rank, text: merge.to_string() });
            }
            // A merge whose parts or result are not tokens can never apply to token symbols: skip it.
            let (Some(&l), Some(&r)) = (bytes_to_id.get(&lb[..]), bytes_to_id.get(&rb[..])) else { continue };
            joined.clear();
            joined.extend_from_slice(&lb);
            joined.extend_from_slice(&rb);
            let Some(&m) = bytes_to_id.get(&joined[..]) else { continue };
            // The first (lowest-rank) occurrence of a pair wins.
            table.entry(pair_key(l, r)).or_insert((rank as u32, m));
        }
        Ok(BpeModel { byte_ids, merges: table, bytes_to_id })
    }

    /// Bytes held by the tables (approximate: a hash map slot is counted as its key and value, plus a control byte).
    pub fn heap_bytes(&self) -> usize {
        let merges = self.merges.capacity() * (8 + 8 + 1);
        let keys: usize = self.bytes_to_id.keys().map(|k| k.len()).sum();
        merges + self.bytes_to_id.capacity() * (16 + 4 + 1) + keys
    }

    /// The id of a token given as raw bytes.
    pub fn id_of_bytes(&self, bytes: &[u8]) -> Option<u32> {
        self.bytes_to_id.get(bytes).copied()
    }

    /// Appends the tokens of one pre-tokenized word. Bytes that have no token are left out before merging (as
    /// Hugging Face `tokenizers` does for a BPE model without an unknown token; llama.cpp aborts), so their neighbours
    /// can still merge.
    pub fn encode_word(&self, word: &[u8], ignore_merges: bool, scratch: &mut BpeScratch, out: &mut Vec<u32>) {
        if word.is_empty() {
            return;
        }
        if ignore_merges && let Some(&id) = self.bytes_to_id.get(word) {
            out.push(id);
            return;
        }
        if word.len() == 1 {
            let id = self.byte_ids[word[0] as usize];
            if id != NONE {
                out.push(id);
            }
            return;
        }
        let syms = &mut scratch.syms;
        let heap = &mut scratch.heap;
        syms.clear();
        heap.clear();
        for &b in word {
            let id = self.byte_ids[b as usize];
            if id != NONE {
                let i = syms.len() as u32;
                syms.push(Sym { id, prev: i.wrapping_sub(1), next: i + 1 });
            }
        }
        let n = syms.len();
        if n == 0 {
            return;
        }
        syms[n - 1].next = NONE;
        for i in 0..n - 1 {
            self.push_pair(syms, heap, i as u32, i as u32 + 1);
        }
        while let Some(Reverse(c)) = heap.pop() {
            let (l, r) = (c.left as usize, c.right as usize);
            // Stale if either side has been merged since (its id changed or it was absorbed).
            if syms[l].id != c.left_id || syms[r].id != c.right_id || syms[l].next != c.right {
                continue;
            }
            syms[l].id = c.merged;
            let rn = syms[r].next;
            syms[l].next = rn;
            syms[r].id = NONE;
            syms[r].prev = NONE;
            syms[r].next = NONE;
            if rn != NONE {
                syms[rn as usize].prev = c.left;
            }
            let lp = syms[l].prev;
            if lp != NONE {
                self.push_pair(syms, heap, lp, c.left);
            }
            if rn != NONE {
                self.push_pair(syms, heap, c.left, rn);
            }
        }
        // Walk the chain from the first symbol (which is never absorbed: merges absorb the right side).
        let mut i = 0u32;
        while i != NONE {
            let s = syms[i as usize];
            out.push(s.id);
            i = s.next;
        }
    }

    #[inline]
    fn push_pair(&self, syms: &[Sym], heap: &mut BinaryHeap<Reverse<Candidate>>, left: u32, right: u32) {
        let (lid, rid) = (syms[left as usize].id, syms[right as usize].id);
        if lid == NONE || rid == NONE {
            return;
        }
        if let Some(&(rank, merged)) = self.merges.get(&pair_key(lid, rid)) {
            heap.push(Reverse(Candidate { rank, left, right, left_id: lid, right_id: rid, merged }));
        }
    }
}

#[inline]
fn pair_key(l: u32, r: u32) -> u64 {
    (u64::from(l) << 32) | u64::from(r)
}

#[derive(Clone, Copy)]
struct Sym {
    id: u32,
    prev: u32,
    next: u32,
}

/// A merge waiting in the heap; ordered by rank, then position (leftmost first).
#[derive(Clone, Copy, PartialEq, Eq)]
struct Candidate {
    rank: u32,
    left: u32,
    right: u32,
    left_id: u32,
    right_id: u32,
    merged: u32,
}

impl Ord for Candidate {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        (self.rank, self.left, self.right, self.left_id, self.right_id, self.merged).cmp(&(
            other.rank,
            other.left,
            other.right,
            other.left_id,
            other.right_id,
            other.merged,
        ))
    }
}

impl PartialOrd for Candidate {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

/// Buffers reused across words.
#[derive(Default)]
pub struct BpeScratch {
    syms: Vec<Sym>,
    heap: BinaryHeap<Reverse<Candidate>>,
}
