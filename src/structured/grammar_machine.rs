//! Running a compiled [`Grammar`] over bytes, and the token constraint built on it.
//!
//! The parse state is a set of stacks, as in a pushdown automaton that follows every alternative at once. A stack
//! holds positions in [`Grammar::elems`]: its top is the next element to match, the entries below are where to go
//! on when the rule above ends. After each byte, every stack is expanded until its top is a byte set (a rule
//! reference pushes each alternative; an alternative's end pops), or until it is empty, which means the text so far
//! is a whole match of `root`. A reference that ends its alternative replaces that entry instead of sitting on top
//! of it (a tail call), so `x*`, written as `r ::= x r | ε`, keeps its stacks as shallow after a thousand `x` as
//! after one.
//!
//! The token mask walks the vocabulary with a state that must be `Copy` ([`SortedVocab::fill_mask`]), and a
//! grammar's sets of stacks are not. So each distinct set is interned and the walk carries its number, and the
//! step from a number over a byte is remembered in a table of 256 per state: inside a long run of text the same few
//! states recur, and most steps are one load. The tables start over (keeping the current state) when they grow
//! past [`MAX_STATES`].

use std::cell::RefCell;
use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::Arc;

use super::grammar::{Elem, Grammar};
use super::vocab::SortedVocab;
use super::{MaskCache, Refused};

/// The most entries a stack may have: nesting deeper than this is refused, as JSON nesting is past its limit.
pub const MAX_DEPTH: usize = 256;
/// The most stacks one state may have (a grammar whose start needs more is refused when it compiles; a byte that
/// would need more later is refused).
pub const MAX_STACKS: usize = 1 << 12;
/// The most stack entries one step may write (its stacks, and the ones it expanded on the way): a bound on the
/// work of a step, so that a grammar ambiguous enough to fork at every byte (`r ::= "(" r* ")" | [^()]+ ...`,
/// which a fuzz run found taking seconds) narrows what it allows instead of stalling a mask.
pub const MAX_STEP_ENTRIES: usize = 1 << 14;
/// Interned states after which the tables start over (each state that was stepped from has 1 KB of them).
pub const MAX_STATES: usize = 1 << 14;
/// Stack entries, over all interned states, after which the tables start over; during a mask's walk, past twice
/// this, new states are refused instead, so that a hostile grammar narrows the mask rather than filling memory.
pub const MAX_ENTRIES: usize = 1 << 22;

/// A state number's step over a byte that the grammar refuses.
const REFUSED: u32 = u32::MAX;
/// A step not worked out yet.
const UNKNOWN: u32 = u32::MAX - 1;

type Stack = Vec<u32>;

/// A small multiplicative hasher for the interning table: its keys are stacks of positions made here, not text an
/// attacker picks the hash of (and the number of states is bounded anyway).
#[derive(Default, Clone, Copy)]
struct MulHasher(u64);

impl Hasher for MulHasher {
    fn write(&mut self, bytes: &[u8]) {
        for chunk in bytes.chunks(8) {
            let mut word = [0u8; 8];
            word[..chunk.len()].copy_from_slice(chunk);
            self.write_u64(u64::from_le_bytes(word));
        }
    }
    fn write_u64(&mut self, v: u64) {
        self.0 = (self.0.rotate_left(5) ^ v).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
    }
    fn write_u32(&mut self, v: u32) {
        self.write_u64(u64::from(v));
    }
    fn write_usize(&mut self, v: usize) {
        self.write_u64(v as u64);
    }
    fn finish(&self) -> u64 {
        self.0
    }
}

type Fast<K, V> = HashMap<K, V, BuildHasherDefault<MulHasher>>;

/// A set of stacks, with what the constraint asks of it.
#[derive(Debug)]
struct State {
    stacks: Vec<Stack>,
    /// An empty stack is in the set: the text so far matches the grammar.
    accepting: bool,
    /// A non-empty stack is in the set: more text can follow.
    open: bool,
    /// The state after each byte ([`REFUSED`], [`UNKNOWN`]), made at the first step from this one.
    next: Option<Box<[u32; 256]>>,
}

/// The grammar's interned states and their steps.
#[derive(Debug)]
pub struct GrammarMachine {
    grammar: Arc<Grammar>,
    states: Vec<State>,
    ids: Fast<Vec<Stack>, u32>,
    /// Stack entries over all interned states.
    entries: usize,
}

impl GrammarMachine {
    /// The machine with its start state as number 0. [`Grammar::parse`] has checked that the start fits the
    /// limits.
    pub fn new(grammar: Arc<Grammar>) -> GrammarMachine {
        let mut m = GrammarMachine { grammar, states: Vec::new(), ids: Fast::default(), entries: 0 };
        let start = m.start_stacks().unwrap_or_default();
        m.intern(start);
        m
    }

    /// The start state's stacks, or `None` if they pass [`MAX_STACKS`], [`MAX_STEP_ENTRIES`] or [`MAX_DEPTH`].
    pub(super) fn start_stacks(&self) -> Option<Vec<Stack>> {
        let mut out = Vec::new();
        let mut entries = 0;
        let root = &self.grammar.rules[self.grammar.root as usize];
        for &alt in &root.alts {
            if !self.expand(vec![alt], &mut out, &mut entries) {
                return None;
            }
        }
        out.sort_unstable();
        out.dedup();
        Some(out)
    }

    /// For [`Grammar::parse`]: whether the start fits the limits.
    pub(super) fn start_fits(grammar: &Arc<Grammar>) -> bool {
        GrammarMachine { grammar: grammar.clone(), states: Vec::new(), ids: Fast::default(), entries: 0 }
            .start_stacks()
            .is_some()
    }

    pub fn start(&self) -> u32 {
        0
    }

    /// Whether the text that led to `state` is a whole match.
    pub fn is_accepting(&self, state: u32) -> bool {
        self.states[state as usize].accepting
    }

    /// Whether any byte can follow the text that led to `state`.
    pub fn is_open(&self, state: u32) -> bool {
        self.states[state as usize].open
    }

    /// The state after byte `b`, or `None` where the grammar refuses it.
    #[inline]
    pub fn step(&mut self, state: u32, b: u8) -> Option<u32> {
        if let Some(table) = &self.states[state as usize].next {
            match table[usize::from(b)] {
                UNKNOWN => {}
                REFUSED => return None,
                next => return Some(next),
            }
        }
        self.step_slow(state, b)
    }

    #[cold]
    fn step_slow(&mut self, state: u32, b: u8) -> Option<u32> {
        let next = self.compute_step(state, b).and_then(|stacks| self.try_intern(stacks));
        let table = self.states[state as usize].next.get_or_insert_with(|| Box::new([UNKNOWN; 256]));
        table[usize::from(b)] = next.unwrap_or(REFUSED);
        next
    }

    /// The state after `bytes`, or `None` if a byte is refused.
    pub fn feed(&mut self, mut state: u32, bytes: &[u8]) -> Option<u32> {
        for &b in bytes {
            state = self.step(state, b)?;
        }
        Some(state)
    }

    /// Interned states so far.
    pub fn n_states(&self) -> usize {
        self.states.len()
    }

    /// Whether the tables are large enough to start over.
    pub fn is_full(&self) -> bool {
        self.states.len() > MAX_STATES || self.entries > MAX_ENTRIES
    }

    /// Forgets every state but `keep`, which becomes number 0 (so old numbers must not be used again).
    pub fn start_over(&mut self, keep: u32) -> u32 {
        let stacks = std::mem::take(&mut self.states[keep as usize].stacks);
        self.states.clear();
        self.ids.clear();
        self.entries = 0;
        self.intern(stacks)
    }

    /// As [`Self::intern`], refusing a new state past twice [`MAX_ENTRIES`].
    fn try_intern(&mut self, stacks: Vec<Stack>) -> Option<u32> {
        if let Some(&id) = self.ids.get(&stacks) {
            return Some(id);
        }
        (self.entries <= 2 * MAX_ENTRIES).then(|| self.intern(stacks))
    }

    fn intern(&mut self, stacks: Vec<Stack>) -> u32 {
        if let Some(&id) = self.ids.get(&stacks) {
            return id;
        }
        self.entries += stacks.iter().map(|s| s.len().max(1)).sum::<usize>();
        let id = self.states.len() as u32;
        let accepting = stacks.iter().any(|s| s.is_empty());
        let open = stacks.iter().any(|s| !s.is_empty());
        self.ids.insert(stacks.clone(), id);
        self.states.push(State { stacks, accepting, open, next: None });
        id
    }

    fn compute_step(&self, state: u32, b: u8) -> Option<Vec<Stack>> {
        let g = &*self.grammar;
        let mut out = Vec::new();
        let mut entries = 0;
        for stack in &self.states[state as usize].stacks {
            let Some(&top) = stack.last() else { continue };
            let Elem::Byte(set) = g.elems[top as usize] else { continue };
            if !g.set_has(set, b) {
                continue;
            }
            let mut next = stack.clone();
            *next.last_mut()? = top + 1;
            if !self.expand(next, &mut out, &mut entries) {
                return None;
            }
        }
        out.sort_unstable();
        out.dedup();
        (!out.is_empty()).then_some(out)
    }

    /// Expands `stack` (whose top may be any element) into stacks whose tops are byte sets, or empty ones, added
    /// to `out`, counting the entries written in `entries`. False if a stack went past [`MAX_DEPTH`], the set past
    /// [`MAX_STACKS`] or the entries past [`MAX_STEP_ENTRIES`].
    fn expand(&self, stack: Stack, out: &mut Vec<Stack>, entries: &mut usize) -> bool {
        let g = &*self.grammar;
        *entries += stack.len();
        let mut work = vec![stack];
        while let Some(mut s) = work.pop() {
            loop {
                let Some(&top) = s.last() else {
                    out.push(s);
                    break;
                };
                match g.elems[top as usize] {
                    Elem::Byte(_) => {
                        out.push(s);
                        break;
                    }
                    // The alternative is over: go on where the rule was referenced.
                    Elem::End => {
                        s.pop();
                    }
                    Elem::Rule(r) => {
                        s.pop();
                        if g.elems[top as usize + 1] != Elem::End {
                            s.push(top + 1);
                        }
                        if s.len() >= MAX_DEPTH {
                            return false;
                        }
                        for &alt in &g.rules[r as usize].alts {
                            let mut t = s.clone();
                            t.push(alt);
                            *entries += t.len();
                            work.push(t);
                        }
                        break;
                    }
                }
            }
            // Left recursion was refused when compiling, so this is only a guard against a combinatorial
            // explosion of alternatives.
            if out.len() + work.len() > MAX_STACKS || *entries > MAX_STEP_ENTRIES {
                return false;
            }
        }
        true
    }
}

/// One sequence's grammar constraint: the machine, the current state, and masks of recent states.
#[derive(Debug)]
pub struct GrammarConstraint {
    vocab: Arc<SortedVocab>,
    machine: RefCell<GrammarMachine>,
    state: u32,
    /// An end-of-generation token was taken (where the text was a whole match).
    ended: bool,
    cache: MaskCache<u32>,
    scratch: Vec<u32>,
}

impl GrammarConstraint {
    pub fn new(vocab: Arc<SortedVocab>, grammar: Arc<Grammar>) -> GrammarConstraint {
        let machine = GrammarMachine::new(grammar);
        GrammarConstraint {
            vocab,
            state: machine.start(),
            machine: RefCell::new(machine),
            ended: false,
            cache: MaskCache::new(),
            scratch: Vec::new(),
        }
    }

    /// The tokens allowed next: those whose bytes the grammar takes from here, and the end-of-generation tokens
    /// where the text so far is a whole match.
    pub fn mask(&mut self) -> &[u64] {
        if !self.cache.has(self.state) && self.machine.get_mut().is_full() {
            // The machine's tables start over, and with them the state numbers the masks are kept by.
            self.state = self.machine.get_mut().start_over(self.state);
            self.cache.clear();
        }
        let (machine, vocab, scratch, state) = (&self.machine, &self.vocab, &mut self.scratch, self.state);
        self.cache.get(state, |mask| {
            let step = |s: &mut u32, b: u8| match machine.borrow_mut().step(*s, b) {
                Some(next) => {
                    *s = next;
                    true
                }
                None => false,
            };
            vocab.fill_mask(&state, None, step, mask, scratch);
            if machine.borrow_mut().is_accepting(state) {
                for &id in vocab.eog() {
                    mask[id as usize / 64] |= 1 << (id % 64);
                }
            }
        })
    }

    /// Why no token is allowed here, for a request that ran into it: the bytes the grammar would take next (which
    /// no token of the vocabulary begins a continuation with), or that it takes none (a limit was reached).
    pub fn dead_end(&mut self) -> String {
        let machine = self.machine.get_mut();
        let bytes: Vec<u8> = (0..=255u8).filter(|&b| machine.step(self.state, b).is_some()).collect();
        if bytes.is_empty() {
            let ending = if machine.is_accepting(self.state) {
                " and the vocabulary has no end-of-generation token"
            } else {
                ""
            };
            return format!(
                "the grammar allows no byte here{ending} (the text so far reached one of its limits: nesting {MAX_DEPTH} \
                 deep, or more than {MAX_STACKS} alternatives at once)"
            );
        }
        format!(
            "the grammar can only go on with {}, and no token of the vocabulary (left by the logit bias) can",
            describe_bytes(&bytes)
        )
    }

    /// Advances past `token` (its bytes as the tokenizer decodes them), which must be allowed.
    pub fn accept(&mut self, token: u32, bytes: &[u8]) -> Result<(), Refused> {
        let machine = self.machine.get_mut();
        if self.vocab.eog().contains(&token) {
            if self.ended || !machine.is_accepting(self.state) {
                return Err(Refused { token });
            }
            self.ended = true;
            return Ok(());
        }
        match machine.feed(self.state, bytes) {
            Some(next) if !bytes.is_empty() && !self.ended => {
                self.state = next;
                Ok(())
            }
            _ => Err(Refused { token }),
        }
    }

    /// Whether generation should end: an end-of-generation token was taken, or the text is a whole match that
    /// nothing can extend.
    pub fn is_complete(&self) -> bool {
        let machine = self.machine.borrow();
        self.ended || (machine.is_accepting(self.state) && !machine.is_open(self.state))
    }
}

/// A set of bytes as ranges, printable ASCII as itself: `[0-9a-f]`, `["]`, `[\x80-\xbf]`.
fn describe_bytes(bytes: &[u8]) -> String {
    let show = |b: u8| if b.is_ascii_graphic() || b == b' ' { (b as char).to_string() } else { format!("\\x{b:02x}") };
    let mut out = String::from("[");
    let mut i = 0;
    while i < bytes.len() {
        let mut j = i;
        while j + 1 < bytes.len() && bytes[j + 1] == bytes[j] + 1 {
            j += 1;
        }
        out += &show(bytes[i]);
        if j > i {
            out += "-";
            out += &show(bytes[j]);
        }
        i = j + 1;
    }
    out + "]"
}

#[cfg(test)]
mod tests {
    #[test]
    fn byte_sets_read_as_ranges() {
        assert_eq!(super::describe_bytes(b"0123456789"), "[0-9]");
        assert_eq!(super::describe_bytes(b"\"ace"), "[\"ace]");
        assert_eq!(super::describe_bytes(&[0x0a, b' ', 0x80, 0x81, 0xbf]), "[\\x0a \\x80-\\x81\\xbf]");
    }
}
