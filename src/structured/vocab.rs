//! The vocabulary as the constraint walks it: every token that can appear in output text, sorted by its bytes, so
//! tokens sharing a prefix sit together and the machine runs over each shared prefix once.
//!
//! Two shortcuts keep a mask well under a decode step even for Gemma's 262k tokens:
//! - tokens are grouped by first byte, and a group whose first byte the machine refuses is skipped whole (between
//!   values, only whitespace, quotes, brackets, digits and a few letters can come next);
//! - inside a string, a token of plain text (whole UTF-8 characters, no quote, backslash or control byte) leaves the
//!   machine where it was, so all of those are allowed at once from a precomputed mask and only the other tokens
//!   are walked.

use crate::tokenizer::{TokenType, Tokenizer};

use super::json::JsonMachine;

/// Tokens in the byte order of their pieces, grouped by first byte.
#[derive(Debug, Default)]
struct SortedTokens {
    ids: Vec<u32>,
    /// Each token's piece, concatenated in `ids` order; token `i` spans `ends[i - 1]..ends[i]`.
    bytes: Vec<u8>,
    ends: Vec<u32>,
    /// Leading bytes token `i` has in common with token `i - 1` (0 for the first of a group).
    shared: Vec<u16>,
    /// For each first byte, the range of `ids` whose pieces start with it.
    groups: Vec<(u8, u32, u32)>,
}

impl SortedTokens {
    /// `order` must be sorted by piece.
    fn new<'a>(order: Vec<u32>, piece: impl Fn(u32) -> &'a [u8]) -> SortedTokens {
        let mut t = SortedTokens { ends: Vec::with_capacity(order.len()), ..SortedTokens::default() };
        let mut prev: &[u8] = &[];
        for (i, &id) in order.iter().enumerate() {
            let p = piece(id);
            let common = p.iter().zip(prev).take_while(|(a, b)| a == b).count();
            t.shared.push(common as u16);
            if common == 0 {
                t.groups.push((p[0], i as u32, i as u32 + 1));
            } else if let Some(g) = t.groups.last_mut() {
                g.2 = i as u32 + 1;
            }
            t.bytes.extend_from_slice(p);
            t.ends.push(t.bytes.len() as u32);
            prev = p;
        }
        t.ids = order;
        t
    }

    /// Sets the bit of every token whose bytes `machine` accepts in full (other bits are left as they are).
    ///
    /// A token repeats the first `shared` bytes of the one before: the machine's state after each byte of the
    /// previous token is kept in `states`, and a token starts from the state its shared prefix left. When a prefix
    /// was refused, every following token that shares it is refused without running.
    fn walk(&self, machine: &JsonMachine, mask: &mut [u64], states: &mut [JsonMachine]) {
        for &(first, start, end) in &self.groups {
            if !machine.can_take(first) {
                continue;
            }
            // Bytes of the previous token the machine accepted (the index of its first refused byte).
            let mut accepted = 0usize;
            states[0] = *machine;
            let mut from = if start == 0 { 0 } else { self.ends[start as usize - 1] as usize };
            for i in start as usize..end as usize {
                let to = self.ends[i] as usize;
                let piece = &self.bytes[from..to];
                from = to;
                let common = usize::from(self.shared[i]);
                if accepted < common {
                    // The shared prefix already failed at byte `accepted`.
                    continue;
                }
                let mut m = states[common];
                accepted = common;
                for &b in &piece[common..] {
                    if !m.step(b) {
                        break;
                    }
                    accepted += 1;
                    states[accepted] = m;
                }
                if accepted == piece.len() {
                    let id = self.ids[i];
                    mask[id as usize / 64] |= 1 << (id % 64);
                }
            }
        }
    }
}

/// The vocabulary for the JSON constraint.
#[derive(Debug)]
pub struct SortedVocab {
    /// Every token with text.
    all: SortedTokens,
    /// The tokens that are not plain string text (see [`SortedVocab::inert`]).
    in_string: SortedTokens,
    /// Tokens a string's plain inside accepts without changing state: whole UTF-8 characters, none of them a
    /// quote, a backslash or a control character.
    inert: Vec<u64>,
    n_vocab: usize,
    longest: usize,
}

impl SortedVocab {
    /// Every token of `tokenizer` with text: control and unknown tokens (which decode to nothing) and the
    /// end-of-generation tokens are left out, so a constraint never allows them.
    pub fn new(tokenizer: &Tokenizer) -> SortedVocab {
        let n_vocab = tokenizer.n_vocab();
        let piece = |id: u32| tokenizer.token_bytes(id, true);
        let mut order: Vec<u32> = (0..n_vocab as u32)
            .filter(|&id| {
                !tokenizer.is_eog(id)
                    && !matches!(tokenizer.token_type(id), Some(TokenType::Control | TokenType::Unknown))
                    && !piece(id).is_empty()
                    // `shared` counts in u16; pieces this long exist only as special text.
                    && piece(id).len() < usize::from(u16::MAX)
            })
            .collect();
        order.sort_unstable_by(|&a, &b| piece(a).cmp(piece(b)).then(a.cmp(&b)));
        let longest = order.iter().map(|&id| piece(id).len()).max().unwrap_or(0);

        // Inertness, asked of the machine itself: from inside a string, the token never leaves it and ends where it
        // began. (Leaving and coming back, as `":"","` does from inside a key, is not inert: inside a value the
        // same bytes are refused.)
        let mut in_string = JsonMachine::new();
        assert!(in_string.feed(b"{\""));
        let mut inert = vec![0u64; n_vocab.div_ceil(64)];
        let mut active = Vec::new();
        for &id in &order {
            let mut m = in_string;
            if piece(id).iter().all(|&b| m.step(b) && m.in_string()) && m == in_string {
                inert[id as usize / 64] |= 1 << (id % 64);
            } else {
                active.push(id);
            }
        }
        let all = SortedTokens::new(order, piece);
        let in_string = SortedTokens::new(active, piece);
        SortedVocab { all, in_string, inert, n_vocab, longest }
    }

    /// Sets bit `id` of `mask` (`n_vocab` bits, 64 per word) for every token whose bytes `machine` accepts in full,
    /// and clears every other bit. `states` is scratch space.
    pub fn fill_mask(&self, machine: &JsonMachine, mask: &mut Vec<u64>, states: &mut Vec<JsonMachine>) {
        mask.clear();
        states.clear();
        states.resize(self.longest + 1, *machine);
        if machine.in_plain_string() {
            mask.extend_from_slice(&self.inert);
            self.in_string.walk(machine, mask, states);
        } else {
            mask.resize(self.n_vocab.div_ceil(64), 0);
            self.all.walk(machine, mask, states);
        }
    }
}

/// Whether bit `id` of `mask` is set.
pub fn allows(mask: &[u64], id: u32) -> bool {
    mask.get(id as usize / 64).is_some_and(|w| w >> (id % 64) & 1 == 1)
}
