//! A byte-at-a-time recognizer of the JSON texts a compiled [`JsonSchema`] generates: the schema's structure
//! (which keys, in which order, which kinds of value, how many items, how long a string, which `enum` values)
//! over the plain JSON grammar of [`super::json`], whose string and number rules it shares and whose machine it
//! runs for values the schema leaves free.
//!
//! Like [`JsonMachine`], the state is a `Copy` value compared whole (the mask cache finds masks by it); it holds
//! node indices into the schema, which every step takes by reference. Open containers are a fixed stack of
//! [`MAX_FRAMES`] frames; free values nest up to the JSON machine's own limit inside one.

use super::json::{
    JsonMachine, LITERALS, MAX_NUMBER_LEN, NumAt, StrAt, StrStep, WsRun, is_ws, number_byte, string_byte,
};
use super::schema::{JsonSchema, Node, NodeId, Pick, Property, variant_depth};

/// Deepest nesting of the schema's own objects and arrays.
pub const MAX_FRAMES: usize = 16;

/// An open object or array of the schema.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
struct Frame {
    node: NodeId,
    array: bool,
    /// Declared objects: the index of the first property not yet passed. Arrays: items so far (saturating).
    count: u32,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum At {
    /// A value of `node` comes next.
    Value(NodeId),
    /// In a declared object after `{` (`first`) or `,`: a key, or `}` where allowed.
    Key {
        first: bool,
    },
    /// Inside a declared key: bit `i` of `cands` is property `count + i` of the top frame, still matching after
    /// `pos` bytes of its quoted name.
    InKey {
        cands: u64,
        pos: u16,
    },
    /// In a dictionary after `{` (`first`) or `,`: a key (any string), or `}` after `{`.
    MapKey {
        first: bool,
    },
    InMapKey(StrAt),
    /// After a key: `:`, then a value of the node.
    Colon(NodeId),
    /// After `[`: an item or `]`.
    ItemOrClose,
    /// After a value in the top frame: `,` or its closing bracket.
    AfterValue,
    /// Inside a string of `node`; `chars` counts characters when the node bounds them.
    InString {
        node: NodeId,
        chars: u32,
        at: StrAt,
    },
    InNumber {
        integer: bool,
        at: NumAt,
        len: u8,
    },
    /// Inside a bounded number of `node`: its sign and integer part so far (`mag`).
    InRanged {
        node: NodeId,
        at: NumAt,
        neg: bool,
        mag: i64,
        len: u8,
    },
    /// Inside an `enum`/`const` value: texts `lo..hi` of the node still match after `pos` bytes.
    InValues {
        node: NodeId,
        lo: u16,
        hi: u16,
        pos: u16,
    },
    InLiteral {
        word: u8,
        pos: u8,
    },
    /// Inside a value the schema leaves free.
    InAny(JsonMachine),
    /// The top-level value is complete.
    Done,
}

/// Where generation against a schema is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SchemaMachine {
    frames: [Frame; MAX_FRAMES],
    depth: u8,
    ws: WsRun,
    at: At,
}

impl SchemaMachine {
    pub fn new(schema: &JsonSchema) -> SchemaMachine {
        SchemaMachine { frames: [Frame::default(); MAX_FRAMES], depth: 0, ws: WsRun::NONE, at: At::Value(schema.root) }
    }

    pub fn is_complete(&self) -> bool {
        self.at == At::Done
    }

    /// Whether the machine is inside a string between characters, and how many more characters it takes
    /// (`u32::MAX`: any number): plain characters change nothing else, so the vocabulary's inert tokens apply at
    /// once by their length ([`super::SortedVocab::fill_mask`]). A free string, a dictionary key, a string of a
    /// free value, or a string of bounded length.
    pub fn plain_string(&self, schema: &JsonSchema) -> Option<u32> {
        match self.at {
            At::InString { node, chars, at: StrAt::Plain } => match *schema.node(node) {
                Node::String { min: 0, max: u32::MAX } => Some(u32::MAX),
                Node::String { max, .. } => Some(max - chars),
                _ => None,
            },
            At::InMapKey(StrAt::Plain) => Some(u32::MAX),
            At::InAny(m) if m.in_plain_string() => Some(u32::MAX),
            _ => None,
        }
    }

    /// Accepts every byte of `bytes`, or returns `false` at the first refused one (the machine is then part-way).
    pub fn feed(&mut self, schema: &JsonSchema, bytes: &[u8]) -> bool {
        bytes.iter().all(|&b| self.step(schema, b))
    }

    /// Accepts `b` if the text so far plus `b` can still become a value of the schema, and says whether it did.
    /// A refused byte leaves the machine unchanged.
    pub fn step(&mut self, schema: &JsonSchema, b: u8) -> bool {
        let before = *self;
        let ok = self.step_inner(schema, b);
        if !ok {
            *self = before;
        }
        ok
    }

    fn top(&mut self) -> &mut Frame {
        &mut self.frames[usize::from(self.depth) - 1]
    }

    fn step_inner(&mut self, s: &JsonSchema, b: u8) -> bool {
        // Inside a lexeme: no whitespace rules apply.
        match self.at {
            At::InKey { cands, pos } => return self.key_byte(s, cands, pos, b),
            At::InMapKey(at) => {
                return match string_byte(at, b) {
                    StrStep::Refused => false,
                    StrStep::Closed => {
                        let Node::Map { value } = *s.node(self.top().node) else { unreachable!() };
                        self.at = At::Colon(value);
                        true
                    }
                    StrStep::Inside(next) => {
                        self.at = At::InMapKey(next);
                        true
                    }
                };
            }
            At::InString { node, chars, at } => return self.string_byte(s, node, chars, at, b),
            At::InLiteral { word, pos } => {
                let lit = LITERALS[usize::from(word)];
                if lit[usize::from(pos)] != b {
                    return false;
                }
                if usize::from(pos) + 1 == lit.len() {
                    self.value_done();
                } else {
                    self.at = At::InLiteral { word, pos: pos + 1 };
                }
                return true;
            }
            At::InNumber { integer, at, len } => {
                let next = number_byte(at, b).filter(|n| !integer || matches!(n, NumAt::Zero | NumAt::Int));
                if let Some(next) = next {
                    if len >= MAX_NUMBER_LEN {
                        return false;
                    }
                    self.at = At::InNumber { integer, at: next, len: len + 1 };
                    return true;
                }
                if !at.can_end() {
                    return false;
                }
                // The number ended: the byte is whatever follows a value.
                self.value_done();
            }
            At::InRanged { node, at, neg, mag, len } => {
                let Node::Number { integer, range: Some(range) } = s.node(node) else { unreachable!() };
                // No exponent: bounds are checked on the digits as they come.
                let next = number_byte(at, b).filter(|n| !matches!(n, NumAt::E) && (!integer || *n != NumAt::Dot));
                if let Some(next) = next {
                    if len >= MAX_NUMBER_LEN {
                        return false;
                    }
                    let mag = match next {
                        NumAt::Zero | NumAt::Int => match mag.checked_mul(10).map(|m| m + i64::from(b - b'0')) {
                            Some(m) if m <= super::schema::MAX_BOUNDED => m,
                            _ => return false,
                        },
                        _ => mag,
                    };
                    let ok = match next {
                        NumAt::Zero => range.reachable(*integer, neg, 0, false),
                        NumAt::Int => range.reachable(*integer, neg, mag, true),
                        // Every fraction of the integer part fits, or the point is not offered.
                        NumAt::Dot => range.cell(neg, mag),
                        _ => true,
                    };
                    if !ok {
                        return false;
                    }
                    self.at = At::InRanged { node, at: next, neg, mag, len: len + 1 };
                    return true;
                }
                // The number ends here: an integer part must itself be within the bounds (a fraction was checked
                // at its point).
                if !at.can_end() || (at != NumAt::Frac && !range.point(neg, mag)) {
                    return false;
                }
                self.value_done();
            }
            At::InValues { node, lo, hi, pos } => {
                let Node::Values(texts) = s.node(node) else { unreachable!() };
                if let Some((lo2, hi2)) = narrow(texts, lo, hi, pos, b) {
                    self.values_advanced(s, texts, node, lo2, hi2, pos + 1);
                    return true;
                }
                // Only a number can be whole and still followed by more of the value text.
                if texts[usize::from(lo)].len() != usize::from(pos) {
                    return false;
                }
                self.values_done(s, lo);
            }
            At::InAny(m) => {
                let mut next = m;
                if next.step(b) {
                    if next.is_complete() {
                        self.value_done();
                    } else {
                        self.at = At::InAny(next);
                    }
                    return true;
                }
                if !m.ends_in_number() {
                    return false;
                }
                self.value_done();
            }
            At::Done => return false,
            _ => {}
        }
        if is_ws(b) {
            let at_start = self.depth == 0 && matches!(self.at, At::Value(_));
            return !at_start && self.ws.take(b);
        }
        self.ws = WsRun::NONE;
        match self.at {
            At::Value(node) => self.value_start(s, node, b),
            At::Key { first } => {
                let (props, from) = keys_of(s, self.top());
                if b == b'}' {
                    return first && !required_from(props, from) && self.close();
                }
                let cands = match s.node(self.top().node) {
                    Node::Variants { picks, .. } => self.variant_window(s, picks),
                    _ => self.key_window(s, props, from),
                };
                if b != b'"' || cands == 0 {
                    return false;
                }
                // Every quoted name starts with the quote.
                self.at = At::InKey { cands, pos: 1 };
                true
            }
            At::MapKey { first } => match b {
                b'}' if first => self.close(),
                b'"' => {
                    self.at = At::InMapKey(StrAt::Plain);
                    true
                }
                _ => false,
            },
            At::Colon(node) if b == b':' => {
                self.at = At::Value(node);
                true
            }
            At::ItemOrClose => {
                let Node::Array { items, min, max } = *s.node(self.top().node) else { unreachable!() };
                if b == b']' {
                    return min == 0 && self.close();
                }
                max > 0 && self.value_start(s, items, b)
            }
            At::AfterValue => self.after_value(s, b),
            _ => false,
        }
    }

    /// `,` or the closing bracket after a value in the top frame.
    fn after_value(&mut self, s: &JsonSchema, b: u8) -> bool {
        let frame = *self.top();
        match (s.node(frame.node), b) {
            (Node::Object(props), b',') if self.key_window(s, props, frame.count as usize) != 0 => {
                self.at = At::Key { first: false };
                true
            }
            (Node::Object(props), b'}') if !required_from(props, frame.count as usize) => self.close(),
            (Node::Map { .. }, b',') => {
                self.at = At::MapKey { first: false };
                true
            }
            (Node::Map { .. }, b'}') => self.close(),
            (&Node::Array { items, max, .. }, b',') if frame.count < max && self.fits(s, items) => {
                self.at = At::Value(items);
                true
            }
            (&Node::Array { min, .. }, b']') if frame.count >= min => self.close(),
            _ => false,
        }
    }

    /// The first byte of a value of `node`.
    fn value_start(&mut self, s: &JsonSchema, node: NodeId, b: u8) -> bool {
        let Some(node) = s.start(node, b) else { return false };
        if !self.fits(s, node) {
            return false;
        }
        match s.node(node) {
            Node::Any | Node::AnyObject => {
                let mut m =
                    if matches!(s.node(node), Node::Any) { JsonMachine::any_value() } else { JsonMachine::new() };
                if !m.step(b) {
                    return false;
                }
                self.at = At::InAny(m);
                true
            }
            Node::Object(_) | Node::Variants { .. } => self.open(node, At::Key { first: true }),
            Node::Map { .. } => self.open(node, At::MapKey { first: true }),
            Node::Array { .. } => self.open(node, At::ItemOrClose),
            Node::String { .. } => {
                self.at = At::InString { node, chars: 0, at: StrAt::Plain };
                true
            }
            Node::Number { integer, range: Some(range) } => {
                let at = number_start(b);
                let (neg, mag) = (at == NumAt::Minus, if at == NumAt::Int { i64::from(b - b'0') } else { 0 });
                let ok = match at {
                    NumAt::Minus => range.any(*integer, true),
                    _ => range.reachable(*integer, false, mag, at == NumAt::Int),
                };
                if !ok {
                    return false;
                }
                self.at = At::InRanged { node, at, neg, mag, len: 1 };
                true
            }
            &Node::Number { integer, range: None } => {
                self.at = At::InNumber { integer, at: number_start(b), len: 1 };
                true
            }
            Node::Boolean | Node::Null => {
                let word = match b {
                    b't' => 0,
                    b'f' => 1,
                    _ => 2,
                };
                self.at = At::InLiteral { word, pos: 1 };
                true
            }
            Node::Values(texts) => match narrow(texts, 0, texts.len() as u16, 0, b) {
                Some((lo, hi)) => {
                    self.values_advanced(s, texts, node, lo, hi, 1);
                    true
                }
                None => false,
            },
            Node::Union(_) | Node::Pending => false,
        }
    }

    /// After `pos` bytes of an `enum` value matched texts `lo..hi`: done if one of them is whole and nothing can
    /// follow it (anything but a number).
    fn values_advanced(&mut self, s: &JsonSchema, texts: &[Vec<u8>], node: NodeId, lo: u16, hi: u16, pos: u16) {
        let first = &texts[usize::from(lo)];
        let number = first[0] == b'-' || first[0].is_ascii_digit();
        if first.len() == usize::from(pos) && !number {
            self.values_done(s, lo);
        } else {
            self.at = At::InValues { node, lo, hi, pos };
        }
    }

    /// Text `lo` of an `enum`/`const` value ended. In a [`Node::Variants`] still undecided it was the tag: the
    /// frame becomes the alternative the tag names, past its first property.
    fn values_done(&mut self, s: &JsonSchema, lo: u16) {
        if self.depth > 0 {
            let top = *self.top();
            if let Node::Variants { picks, .. } = s.node(top.node) {
                let Pick::Tags(owners) = &picks[top.count as usize] else {
                    unreachable!("named variants switch at the key")
                };
                *self.top() = Frame { node: owners[usize::from(lo)], array: false, count: 1 };
            }
        }
        self.value_done();
    }

    fn key_byte(&mut self, s: &JsonSchema, cands: u64, pos: u16, b: u8) -> bool {
        let (props, from) = keys_of(s, self.top());
        let mut left = 0u64;
        let mut whole = None;
        let mut bits = cands;
        while bits != 0 {
            let i = bits.trailing_zeros() as usize;
            bits &= bits - 1;
            let key = &props[from + i].key;
            if key.get(usize::from(pos)) == Some(&b) {
                left |= 1 << i;
                if key.len() == usize::from(pos) + 1 {
                    whole = Some(from + i);
                }
            }
        }
        if left == 0 {
            return false;
        }
        // A quoted name is never a prefix of another, so a whole one is the only candidate left.
        match whole {
            Some(i) => {
                self.at = At::Colon(props[i].node);
                let top = self.top();
                top.count = i as u32 + 1;
                if let Node::Variants { picks, .. } = s.node(top.node) {
                    // The name picks the alternative, or its value will (the frame keeps which name it was).
                    *top = match picks[i] {
                        Pick::Alt(alt) => Frame { node: alt, array: false, count: 1 },
                        Pick::Tags(_) => Frame { count: i as u32, ..*top },
                    };
                }
            }
            None => self.at = At::InKey { cands: left, pos: pos + 1 },
        }
        true
    }

    fn string_byte(&mut self, s: &JsonSchema, node: NodeId, chars: u32, at: StrAt, b: u8) -> bool {
        let Node::String { min, max } = *s.node(node) else { unreachable!() };
        let counted = !unbounded_string(s.node(node));
        match string_byte(at, b) {
            StrStep::Refused => false,
            StrStep::Closed => {
                if chars < min {
                    return false;
                }
                self.value_done();
                true
            }
            StrStep::Inside(next) => {
                // A byte other than the quote in plain text starts a character.
                if at == StrAt::Plain && chars >= max {
                    return false;
                }
                let chars = if counted && next == StrAt::Plain { chars + 1 } else { chars };
                self.at = At::InString { node, chars, at: next };
                true
            }
        }
    }

    fn open(&mut self, node: NodeId, at: At) -> bool {
        if usize::from(self.depth) >= MAX_FRAMES {
            return false;
        }
        self.depth += 1;
        *self.top() = Frame { node, array: at == At::ItemOrClose, count: 0 };
        self.at = at;
        true
    }

    fn close(&mut self) -> bool {
        *self.top() = Frame::default();
        self.depth -= 1;
        self.value_done();
        true
    }

    /// A value just ended: the top level is done, or the container counts it and waits for `,` or its end.
    fn value_done(&mut self) {
        if self.depth == 0 {
            self.at = At::Done;
            return;
        }
        self.at = At::AfterValue;
        let top = self.top();
        // Objects count properties as their keys are chosen; arrays count items here.
        if top.array {
            top.count = top.count.saturating_add(1);
        }
    }
}

impl SchemaMachine {
    /// Whether a value of `node` opened here could be finished within [`MAX_FRAMES`].
    fn fits(&self, s: &JsonSchema, node: NodeId) -> bool {
        usize::from(self.depth) + usize::from(s.min_depth[usize::from(node)]) <= MAX_FRAMES
    }

    /// The first-property names a [`Node::Variants`] just opened may take, as bits: those whose alternative
    /// could be finished within [`MAX_FRAMES`] (one at least, or the object would not have been opened).
    fn variant_window(&self, s: &JsonSchema, picks: &[Pick]) -> u64 {
        let outside = u32::from(self.depth) - 1;
        let of = |id: NodeId| u32::from(s.min_depth[usize::from(id)]);
        let fits = |alt: NodeId| outside + variant_depth(&s.nodes, alt, of) <= MAX_FRAMES as u32;
        let mut bits = 0u64;
        for (i, pick) in picks.iter().enumerate() {
            let ok = match pick {
                Pick::Alt(alt) => fits(*alt),
                Pick::Tags(owners) => owners.iter().any(|&a| fits(a)),
            };
            if ok {
                bits |= 1 << i;
            }
        }
        bits
    }

    /// The keys that may come next in a declared object, as bits relative to `from`: each optional property up
    /// to and including the first required one (at most 64), leaving out optional ones whose value would not fit
    /// (a required one always fits: its object was opened only if it did).
    fn key_window(&self, s: &JsonSchema, props: &[Property], from: usize) -> u64 {
        let mut bits = 0u64;
        for (i, p) in props.iter().skip(from).take(64).enumerate() {
            if p.required {
                return bits | 1 << i;
            }
            if self.fits(s, p.node) {
                bits |= 1 << i;
            }
        }
        bits
    }
}

/// The declared keys of an object frame and the index of the first not yet passed; a [`Node::Variants`] frame's are
/// its first-property names, all ahead of it.
fn keys_of<'s>(s: &'s JsonSchema, frame: &Frame) -> (&'s [Property], usize) {
    match s.node(frame.node) {
        Node::Object(props) => (props, frame.count as usize),
        Node::Variants { keys, .. } => (keys, 0),
        _ => unreachable!("keys are read in declared objects"),
    }
}

/// Where a number is after its first byte (`-` or a digit).
fn number_start(b: u8) -> NumAt {
    match b {
        b'-' => NumAt::Minus,
        b'0' => NumAt::Zero,
        _ => NumAt::Int,
    }
}

/// Whether a string node's characters need no counting.
fn unbounded_string(n: &Node) -> bool {
    matches!(n, Node::String { min: 0, max: u32::MAX })
}

/// Whether a required property remains at index `from` or later.
fn required_from(props: &[Property], from: usize) -> bool {
    props.iter().skip(from).any(|p| p.required)
}

/// The texts of `lo..hi` (sorted, sharing their first `pos` bytes) whose byte `pos` is `b`: a contiguous range.
fn narrow(texts: &[Vec<u8>], lo: u16, hi: u16, pos: u16, b: u8) -> Option<(u16, u16)> {
    let range = &texts[usize::from(lo)..usize::from(hi)];
    let p = usize::from(pos);
    let start = range.partition_point(|t| t.len() <= p || t[p] < b);
    let end = range.partition_point(|t| t.len() <= p || t[p] <= b);
    (start < end).then(|| (lo + start as u16, lo + end as u16))
}
