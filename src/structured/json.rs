//! A byte-at-a-time recognizer of one JSON object (RFC 8259), small enough to copy at every step.
//!
//! [`JsonMachine::step`] says whether a byte can extend what was accepted so far into a longer prefix of some valid
//! JSON object; [`JsonMachine::is_complete`] says whether the object has closed. The token mask walks the vocabulary
//! with copies of the machine (one per shared prefix), so the whole state is a `Copy` value of 24 bytes: the open
//! containers are a bit stack in a `u64`, which caps nesting at [`MAX_DEPTH`].
//!
//! Besides the grammar, the machine keeps what a parser (serde_json here) checks and what keeps a model from running
//! in place:
//! - strings are valid UTF-8 (no overlong forms, no surrogates, nothing above U+10FFFF), hold no control bytes, and a
//!   `\u` escape of a high surrogate is followed by one of a low surrogate (lone surrogates are refused);
//! - numbers have at most two exponent digits, so each one fits an f64 (serde_json refuses `1e400`);
//! - whitespace between tokens is spaces, tabs and at most one newline per run, at most [`MAX_WS_RUN`] bytes, and a
//!   number is at most [`MAX_NUMBER_LEN`] bytes: a small model that falls into repeating newlines or digits must
//!   still move on. That leaves room for pretty-printed output (a newline, then the indentation).
//!
//! The text starts with the top-level object's `{` (no whitespace before it) and ends with its `}`, as with OpenAI's
//! `json_object` format and ollama's `format: json`: a bare string or number is rarely what a caller wants, and an
//! object has a clear end, so generation can stop there.

/// Deepest nesting of objects and arrays (the bit stack's width).
pub const MAX_DEPTH: u8 = 64;
/// Longest run of whitespace between tokens of the JSON text, in bytes.
pub const MAX_WS_RUN: u8 = 40;
/// Longest number, in bytes.
pub const MAX_NUMBER_LEN: u8 = 40;

/// Where the machine is. `Copy`, and compared whole (the mask cache finds a state's mask by equality).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct JsonMachine {
    /// Open containers: bit `i` is set when level `i` (0 = outermost) is an object, clear when an array.
    stack: u64,
    depth: u8,
    /// The current run of whitespace.
    ws: WsRun,
    mode: Mode,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// Before the top-level object.
    Start,
    /// Just after `{`: a key or `}`.
    KeyOrClose,
    /// After `,` in an object: a key.
    Key,
    /// After a key: `:`.
    Colon,
    /// After `:`, or after `,` in an array: a value.
    Value,
    /// Just after `[`: a value or `]`.
    ValueOrClose,
    /// After a value inside a container: `,` or the container's closing bracket.
    CommaOrClose,
    /// Inside a string (a key when `key`).
    Str { key: bool, at: StrAt },
    /// Inside `true`, `false` or `null`: `word` indexes [`LITERALS`], `pos` is the next byte's index.
    Literal { word: u8, pos: u8 },
    /// Inside a number: `at` is the grammar position, `len` the bytes so far.
    Number { at: NumAt, len: u8 },
    /// The top-level object has closed: nothing more is accepted.
    Done,
}

/// Position inside a string.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum StrAt {
    Plain,
    /// After `\`.
    Escape,
    /// Inside `\uXXXX`: `digits` read so far, their value, and whether this escape must be a low surrogate.
    Hex {
        digits: u8,
        value: u16,
        low: bool,
    },
    /// After a complete high-surrogate escape: `\` must follow.
    NeedLowBackslash,
    /// After the `\` that follows a high surrogate: `u` must follow.
    NeedLowU,
    /// Inside a multi-byte UTF-8 character: `need` more continuation bytes; the next one lies in `lo..=hi`.
    Utf8 {
        need: u8,
        lo: u8,
        hi: u8,
    },
}

/// Position inside a number, after what the name says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum NumAt {
    Minus,
    Zero,
    Int,
    Dot,
    Frac,
    E,
    ESign,
    /// One exponent digit.
    Exp,
    /// Two exponent digits: the most allowed, so every number fits an f64 (a 40-digit mantissa times 10^99), which
    /// parsers such as serde_json require (they refuse `1e400` as out of range).
    Exp2,
}

impl NumAt {
    /// Whether a number may end here.
    pub(super) fn can_end(self) -> bool {
        matches!(self, NumAt::Zero | NumAt::Int | NumAt::Frac | NumAt::Exp | NumAt::Exp2)
    }
}

pub(super) const LITERALS: [&[u8]; 3] = [b"true", b"false", b"null"];

/// The run of whitespace since the last token of JSON text: bytes so far, and whether one was a newline.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct WsRun {
    len: u8,
    newline: bool,
}

impl WsRun {
    pub(super) const NONE: WsRun = WsRun { len: 0, newline: false };

    /// Takes whitespace byte `b` if the run stays within [`MAX_WS_RUN`] bytes and one newline.
    pub(super) fn take(&mut self, b: u8) -> bool {
        if self.len >= MAX_WS_RUN || (b == b'\n' && self.newline) {
            return false;
        }
        self.len += 1;
        self.newline |= b == b'\n';
        true
    }
}

/// Whitespace the machine lets a model write (JSON also allows `\r`, which a model has no need for).
pub(super) fn is_ws(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\n')
}

impl Default for JsonMachine {
    fn default() -> Self {
        Self::new()
    }
}

impl JsonMachine {
    /// A machine that has accepted nothing yet.
    pub const fn new() -> JsonMachine {
        JsonMachine { stack: 0, depth: 0, ws: WsRun::NONE, mode: Mode::Start }
    }

    /// A machine for one JSON value of any kind (the schema machine's unconstrained values): complete when the
    /// value is, except a number, which can always grow; [`ends_in_number`](Self::ends_in_number) says when one
    /// may stop.
    pub const fn any_value() -> JsonMachine {
        JsonMachine { stack: 0, depth: 0, ws: WsRun::NONE, mode: Mode::Value }
    }

    /// Whether the top-level object (or the value of [`any_value`](Self::any_value)) has closed.
    pub fn is_complete(&self) -> bool {
        self.mode == Mode::Done
    }

    /// Whether the machine holds a whole top-level number that the next byte may end.
    pub fn ends_in_number(&self) -> bool {
        matches!(self.mode, Mode::Number { at, .. } if self.depth == 0 && at.can_end())
    }

    /// Whether the machine sits inside a string (where nearly every byte is accepted).
    pub fn in_string(&self) -> bool {
        matches!(self.mode, Mode::Str { .. })
    }

    /// Whether the machine sits inside a string between characters (not in an escape or a UTF-8 sequence).
    pub fn in_plain_string(&self) -> bool {
        matches!(self.mode, Mode::Str { at: StrAt::Plain, .. })
    }

    /// Whether `b` could come next (the machine is not changed).
    pub fn can_take(&self, b: u8) -> bool {
        let mut m = *self;
        m.step(b)
    }

    /// Accepts every byte of `bytes` or, at the first one that cannot follow, returns `false` (the machine is then
    /// left part-way: callers try bytes on a copy).
    pub fn feed(&mut self, bytes: &[u8]) -> bool {
        bytes.iter().all(|&b| self.step(b))
    }

    /// Accepts `b` if it can extend the text so far towards a valid object, and says whether it did. A refused
    /// byte leaves the machine unchanged.
    pub fn step(&mut self, b: u8) -> bool {
        let before = *self;
        let ok = self.step_inner(b);
        if !ok {
            *self = before;
        }
        ok
    }

    fn step_inner(&mut self, b: u8) -> bool {
        match self.mode {
            Mode::Str { key, at } => return self.string_byte(key, at, b),
            Mode::Literal { word, pos } => {
                let lit = LITERALS[word as usize];
                if lit[pos as usize] != b {
                    return false;
                }
                self.mode = if pos as usize + 1 == lit.len() {
                    self.after_value()
                } else {
                    Mode::Literal { word, pos: pos + 1 }
                };
                return true;
            }
            Mode::Number { at, len } => {
                if let Some(next) = number_byte(at, b) {
                    if len >= MAX_NUMBER_LEN {
                        return false;
                    }
                    self.mode = Mode::Number { at: next, len: len + 1 };
                    return true;
                }
                if !at.can_end() {
                    return false;
                }
                // The number ended; the byte is whatever follows a value.
                self.mode = self.after_value();
            }
            Mode::Done => return false,
            _ => {}
        }
        if is_ws(b) {
            return self.mode != Mode::Start && self.ws.take(b);
        }
        self.ws = WsRun::NONE;
        match (self.mode, b) {
            (Mode::Start, b'{') => self.open(true),
            (Mode::KeyOrClose | Mode::Key, b'"') => {
                self.mode = Mode::Str { key: true, at: StrAt::Plain };
                true
            }
            (Mode::KeyOrClose, b'}') => self.close(),
            (Mode::Colon, b':') => {
                self.mode = Mode::Value;
                true
            }
            (Mode::ValueOrClose, b']') => self.close(),
            (Mode::Value | Mode::ValueOrClose, _) => self.value_start(b),
            (Mode::CommaOrClose, b',') => {
                self.mode = if self.top_is_object() { Mode::Key } else { Mode::Value };
                true
            }
            (Mode::CommaOrClose, b'}') if self.top_is_object() => self.close(),
            (Mode::CommaOrClose, b']') if !self.top_is_object() => self.close(),
            _ => false,
        }
    }

    fn value_start(&mut self, b: u8) -> bool {
        self.mode = match b {
            b'{' => return self.open(true),
            b'[' => return self.open(false),
            b'"' => Mode::Str { key: false, at: StrAt::Plain },
            b'-' => Mode::Number { at: NumAt::Minus, len: 1 },
            b'0' => Mode::Number { at: NumAt::Zero, len: 1 },
            b'1'..=b'9' => Mode::Number { at: NumAt::Int, len: 1 },
            b't' => Mode::Literal { word: 0, pos: 1 },
            b'f' => Mode::Literal { word: 1, pos: 1 },
            b'n' => Mode::Literal { word: 2, pos: 1 },
            _ => return false,
        };
        true
    }

    fn top_is_object(&self) -> bool {
        self.depth > 0 && self.stack >> (self.depth - 1) & 1 == 1
    }

    fn open(&mut self, object: bool) -> bool {
        if self.depth >= MAX_DEPTH {
            return false;
        }
        let bit = 1u64 << self.depth;
        self.stack = if object { self.stack | bit } else { self.stack & !bit };
        self.depth += 1;
        self.mode = if object { Mode::KeyOrClose } else { Mode::ValueOrClose };
        true
    }

    fn close(&mut self) -> bool {
        self.depth -= 1;
        self.stack &= !(1u64 << self.depth);
        self.mode = self.after_value();
        true
    }

    /// Where a value that just ended leaves the machine: done at the top level, else between values.
    fn after_value(&self) -> Mode {
        if self.depth == 0 { Mode::Done } else { Mode::CommaOrClose }
    }

    fn string_byte(&mut self, key: bool, at: StrAt, b: u8) -> bool {
        match string_byte(at, b) {
            StrStep::Refused => false,
            StrStep::Closed => {
                self.mode = if key { Mode::Colon } else { self.after_value() };
                true
            }
            StrStep::Inside(next) => {
                self.mode = Mode::Str { key, at: next };
                true
            }
        }
    }
}

/// What a byte does inside a string.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum StrStep {
    Refused,
    /// The closing quote.
    Closed,
    /// The string goes on; a return to [`StrAt::Plain`] means a character (or escape) is complete.
    Inside(StrAt),
}

/// The string grammar, byte by byte (both machines share it): valid UTF-8, no control bytes, escapes with paired
/// surrogates.
pub(super) fn string_byte(at: StrAt, b: u8) -> StrStep {
    let next = match at {
        StrAt::Plain => match b {
            b'"' => return StrStep::Closed,
            b'\\' => StrAt::Escape,
            0x00..=0x1f => return StrStep::Refused,
            0x20..=0x7f => StrAt::Plain,
            0xc2..=0xdf => StrAt::Utf8 { need: 1, lo: 0x80, hi: 0xbf },
            0xe0 => StrAt::Utf8 { need: 2, lo: 0xa0, hi: 0xbf },
            // 0xed 0xa0.. would encode a surrogate.
            0xed => StrAt::Utf8 { need: 2, lo: 0x80, hi: 0x9f },
            0xe1..=0xef => StrAt::Utf8 { need: 2, lo: 0x80, hi: 0xbf },
            0xf0 => StrAt::Utf8 { need: 3, lo: 0x90, hi: 0xbf },
            0xf1..=0xf3 => StrAt::Utf8 { need: 3, lo: 0x80, hi: 0xbf },
            0xf4 => StrAt::Utf8 { need: 3, lo: 0x80, hi: 0x8f },
            // Continuation bytes without a lead, overlong leads (0xc0, 0xc1), and leads past U+10FFFF.
            _ => return StrStep::Refused,
        },
        StrAt::Utf8 { need, lo, hi } => {
            if !(lo..=hi).contains(&b) {
                return StrStep::Refused;
            }
            if need == 1 { StrAt::Plain } else { StrAt::Utf8 { need: need - 1, lo: 0x80, hi: 0xbf } }
        }
        StrAt::Escape => match b {
            b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't' => StrAt::Plain,
            b'u' => StrAt::Hex { digits: 0, value: 0, low: false },
            _ => return StrStep::Refused,
        },
        StrAt::NeedLowBackslash if b == b'\\' => StrAt::NeedLowU,
        StrAt::NeedLowU if b == b'u' => StrAt::Hex { digits: 0, value: 0, low: true },
        StrAt::NeedLowBackslash | StrAt::NeedLowU => return StrStep::Refused,
        StrAt::Hex { digits, value, low } => {
            let Some(d) = (b as char).to_digit(16) else { return StrStep::Refused };
            let value = value << 4 | d as u16;
            let digits = digits + 1;
            // The escapes this prefix can still become: [first, last].
            let shift = 4 * u32::from(4 - digits);
            let first = u32::from(value) << shift;
            let last = first + ((1 << shift) - 1);
            let overlaps = |lo: u32, hi: u32| first <= hi && last >= lo;
            let possible = if low {
                overlaps(0xdc00, 0xdfff)
            } else {
                // Anything but a lone low surrogate.
                overlaps(0x0000, 0xdbff) || overlaps(0xe000, 0xffff)
            };
            if !possible {
                return StrStep::Refused;
            }
            if digits < 4 {
                StrAt::Hex { digits, value, low }
            } else if !low && (0xd800..=0xdbff).contains(&value) {
                StrAt::NeedLowBackslash
            } else {
                StrAt::Plain
            }
        }
    };
    StrStep::Inside(next)
}

/// Where a byte that continues a number leads, or `None` if it cannot continue it.
pub(super) fn number_byte(at: NumAt, b: u8) -> Option<NumAt> {
    let digit = b.is_ascii_digit();
    Some(match (at, b) {
        (NumAt::Minus, b'0') => NumAt::Zero,
        (NumAt::Minus, _) if digit => NumAt::Int,
        (NumAt::Int, _) if digit => NumAt::Int,
        (NumAt::Zero | NumAt::Int, b'.') => NumAt::Dot,
        (NumAt::Dot | NumAt::Frac, _) if digit => NumAt::Frac,
        (NumAt::Zero | NumAt::Int | NumAt::Frac, b'e' | b'E') => NumAt::E,
        (NumAt::E, b'+' | b'-') => NumAt::ESign,
        (NumAt::E | NumAt::ESign, _) if digit => NumAt::Exp,
        (NumAt::Exp, _) if digit => NumAt::Exp2,
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn accepts(text: &str) -> Option<JsonMachine> {
        let mut m = JsonMachine::new();
        m.feed(text.as_bytes()).then_some(m)
    }

    fn complete(text: &str) -> bool {
        accepts(text).is_some_and(|m| m.is_complete())
    }

    #[test]
    fn whole_objects_complete() {
        for text in [
            "{}",
            "{ }",
            r#"{"a":1}"#,
            r#"{"a": [1, -2.5e+3, 0, 0.0, 1E9, true, false, null, "x"], "b": {"c": {}}}"#,
            r#"{"s": "tab\t \u00e9 \ud83d\ude00 é 😀 \"q\" \\ \/"}"#,
            "{\"k\":\n  [\n    []\n  ]\n}",
        ] {
            assert!(complete(text), "{text}");
            assert!(serde_json::from_str::<serde_json::Value>(text).is_ok(), "{text}");
        }
    }

    #[test]
    fn refuses_what_is_not_json() {
        for text in [
            "[]",
            "1",
            "\"s\"",
            "{a:1}",
            "{'a':1}",
            r#"{"a":01}"#,
            r#"{"a":1.}"#,
            r#"{"a":.5}"#,
            r#"{"a":1e}"#,
            r#"{"a":1e400}"#,
            r#"{"a":-}"#,
            r#"{"a":tru}"#,
            r#"{"a":1,}"#,
            r#"{"a" 1}"#,
            r#"{"a":[1,]}"#,
            r#"{"a":[1}"#,
            r#"{"a":{]}"#,
            "{\"a\":\"x\ny\"}",
            r#"{"a":"\x"}"#,
            r#"{"a":"\ud800"}"#,
            r#"{"a":"\udc00"}"#,
            r#"{"a":"\ud800\u0041"}"#,
            "{} ",
            "{}{}",
            " {}",
            "{\n\n}",
            "{\r\n}",
        ] {
            assert!(!complete(text), "{text}");
        }
        // Bytes that are not UTF-8 inside a string: a lone continuation, an overlong lead, a surrogate, past U+10FFFF.
        for bad in [&b"\"\x80"[..], b"\"\xc0\x80", b"\"\xed\xa0\x80", b"\"\xf4\x90\x80\x80", b"\"\xff"] {
            let mut m = JsonMachine::new();
            assert!(m.feed(b"{\"a\":"));
            assert!(!m.feed(bad), "{bad:?}");
        }
    }

    #[test]
    fn the_state_stays_small() {
        // The mask walk keeps one state per byte of the longest token and copies one per byte it reads.
        assert!(std::mem::size_of::<JsonMachine>() <= 24);
    }

    #[test]
    fn a_refused_byte_leaves_the_machine_as_it_was() {
        let mut m = accepts(r#"{"a":[1"#).unwrap();
        let before = m;
        assert!(!m.step(b'}'));
        assert_eq!(m, before);
        assert!(m.feed(b"]}"));
        assert!(m.is_complete());
        assert!(!m.step(b' '), "nothing follows the closed object");
    }

    #[test]
    fn limits_keep_a_model_moving() {
        let deep = "[".repeat(MAX_DEPTH as usize - 1);
        let m = accepts(&format!("{{\"a\":{deep}")).unwrap();
        assert!(!m.clone().step(b'['), "a 65th level is refused");
        assert!(m.clone().step(b']'));
        let ws = " ".repeat(MAX_WS_RUN as usize - 1);
        let mut m = accepts(&format!("{{\n{ws}")).unwrap();
        assert!(!m.step(b' '));
        assert!(m.step(b'"'));
        let digits = "9".repeat(MAX_NUMBER_LEN as usize);
        let mut m = accepts(&format!("{{\"n\":{digits}")).unwrap();
        assert!(!m.step(b'9'));
        assert!(m.feed(b"}"));
        assert!(m.is_complete());
    }

    mod props {
        use proptest::prelude::*;
        use serde_json::Value;

        use super::*;

        fn value() -> impl Strategy<Value = Value> {
            let leaf = prop_oneof![
                Just(Value::Null),
                any::<bool>().prop_map(Value::Bool),
                any::<i32>().prop_map(Value::from),
                (-1e9f64..1e9).prop_map(Value::from),
                ".*".prop_map(Value::String),
            ];
            leaf.prop_recursive(4, 32, 6, |inner| {
                prop_oneof![
                    prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
                    prop::collection::btree_map(".*", inner, 0..6).prop_map(|m| Value::Object(m.into_iter().collect())),
                ]
            })
        }

        fn object() -> impl Strategy<Value = Value> {
            prop::collection::btree_map(".*", value(), 0..6).prop_map(|m| Value::Object(m.into_iter().collect()))
        }

        proptest! {
            /// Everything serde_json writes (compact or pretty) is accepted, and completes only at its last byte.
            #[test]
            fn accepts_serde_json_output(v in object(), pretty in any::<bool>()) {
                let text = if pretty { serde_json::to_string_pretty(&v).unwrap() } else { v.to_string() };
                let mut m = JsonMachine::new();
                for (i, &b) in text.as_bytes().iter().enumerate() {
                    prop_assert!(!m.is_complete());
                    prop_assert!(m.step(b), "refused byte {i} of {text}");
                }
                prop_assert!(m.is_complete());
            }

            /// Whatever the machine calls a complete object, serde_json parses as one: random edits of valid text,
            /// cut where the machine first refuses or completes.
            #[test]
            fn what_completes_parses(v in object(), edits in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..4)) {
                let mut bytes = v.to_string().into_bytes();
                for (at, b) in edits {
                    let i = at.index(bytes.len());
                    bytes[i] = b;
                }
                let mut m = JsonMachine::new();
                let mut taken = 0;
                for &b in &bytes {
                    if !m.step(b) {
                        break;
                    }
                    taken += 1;
                    if m.is_complete() {
                        break;
                    }
                }
                if m.is_complete() {
                    let parsed: Result<Value, _> = serde_json::from_slice(&bytes[..taken]);
                    prop_assert!(matches!(parsed, Ok(Value::Object(_))), "{:?}", String::from_utf8_lossy(&bytes[..taken]));
                }
            }
        }
    }
}
