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

/// Characters up to which the inert tokens of a bounded string have a mask each (longer ones are listed).
const SHORT_CHARS: usize = 16;

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
    fn walk<M: Copy>(&self, machine: &M, step: &impl Fn(&mut M, u8) -> bool, mask: &mut [u64], states: &mut [M]) {
        for &(first, start, end) in &self.groups {
            if !step(&mut { *machine }, first) {
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
                    if !step(&mut m, b) {
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
    /// For a string of bounded length: `short_inert[k]` holds the inert tokens of at most `k` characters, up to
    /// [`SHORT_CHARS`]; `long_inert` the longer ones with their character counts.
    short_inert: Vec<Vec<u64>>,
    long_inert: Vec<(u32, u32)>,
    n_vocab: usize,
    longest: usize,
    /// The end-of-generation tokens (left out of the walk; a grammar allows them where its text is complete).
    eog: Vec<u32>,
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
        let mut short_inert = vec![vec![0u64; n_vocab.div_ceil(64)]; SHORT_CHARS + 1];
        let mut long_inert = Vec::new();
        let mut active = Vec::new();
        for &id in &order {
            let mut m = in_string;
            // Characters as a string's length counts them: an escape (`\\n`, `\\u00e9`, a surrogate pair) is one.
            let mut chars = 0;
            if piece(id).iter().all(|&b| {
                let ok = m.step(b) && m.in_string();
                chars += usize::from(ok && m.in_plain_string());
                ok
            }) && m == in_string
            {
                inert[id as usize / 64] |= 1 << (id % 64);
                if chars <= SHORT_CHARS {
                    for mask in &mut short_inert[chars..] {
                        mask[id as usize / 64] |= 1 << (id % 64);
                    }
                } else {
                    long_inert.push((id, chars.min(u32::MAX as usize) as u32));
                }
            } else {
                active.push(id);
            }
        }
        let all = SortedTokens::new(order, piece);
        let in_string = SortedTokens::new(active, piece);
        let eog = (0..n_vocab as u32).filter(|&id| tokenizer.is_eog(id)).collect();
        SortedVocab { all, in_string, inert, short_inert, long_inert, n_vocab, longest, eog }
    }

    /// The end-of-generation tokens, which no walk allows.
    pub fn eog(&self) -> &[u32] {
        &self.eog
    }

    /// Sets bit `id` of `mask` (`n_vocab` bits, 64 per word) for every token whose bytes `machine` accepts in full
    /// (`step` runs it a byte at a time, refusing without change), and clears every other bit. `plain_string`:
    /// the machine sits inside a string where each inert token is taken if it has at most that many characters
    /// (`u32::MAX`: any; nothing else changes, so no walk is needed for them). `states` is scratch space.
    pub fn fill_mask<M: Copy>(
        &self,
        machine: &M,
        plain_string: Option<u32>,
        step: impl Fn(&mut M, u8) -> bool,
        mask: &mut Vec<u64>,
        states: &mut Vec<M>,
    ) {
        mask.clear();
        states.clear();
        states.resize(self.longest + 1, *machine);
        if let Some(room) = plain_string {
            match usize::try_from(room).unwrap_or(usize::MAX) {
                r if r == u32::MAX as usize => mask.extend_from_slice(&self.inert),
                r => {
                    mask.extend_from_slice(&self.short_inert[r.min(SHORT_CHARS)]);
                    for &(id, chars) in &self.long_inert {
                        if chars as usize <= r {
                            mask[id as usize / 64] |= 1 << (id % 64);
                        }
                    }
                }
            }
            self.in_string.walk(machine, &step, mask, states);
        } else {
            mask.resize(self.n_vocab.div_ceil(64), 0);
            self.all.walk(machine, &step, mask, states);
        }
    }
}

/// Whether bit `id` of `mask` is set.
pub fn allows(mask: &[u64], id: u32) -> bool {
    mask.get(id as usize / 64).is_some_and(|w| w >> (id % 64) & 1 == 1)
}
