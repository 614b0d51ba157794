//! Tool calls in the formats that chat templates teach their models ([`CallSyntax`]):
//!
//! - Hermes-style templates (Qwen 2.5 and 3, Hermes 2 and 3, and the fine-tunes built on their templates) put each
//!   call between tags, several on separate lines:
//!
//!   ```text
//!   <tool_call>
//!   {"name": "get_weather", "arguments": {"city": "Oslo"}}
//!   </tool_call>
//!   ```
//!
//! - Llama 3.1 to 3.3 templates ask for one bare object as the whole reply:
//!   `{"name": "get_weather", "parameters": {"city": "Oslo"}}`.
//!
//! A model trained on such a template writes its calls this way on its own, so [`crate::tools`] asks for them in
//! this shape when the template has it, instead of its own JSON protocol. [`NativeCallsMachine`] holds a reply to
//! it: each call object is held to a JSON schema (one object alternative per tool, tagged by `name`, its
//! `arguments` or `parameters` the tool's parameters), and with `lazy` (the `auto` tool choice) the reply may be
//! free text instead. With tags, calls follow one another separated by a newline (up to a limit) and begin
//! wherever the model writes the opening tag, after any words: like the lazy grammars of llama.cpp's server, the
//! text is free until the tag appears. A bare object is a call only as the reply's first byte.

use std::sync::Arc;

use super::schema::JsonSchema;
use super::schema_machine::SchemaMachine;
use super::vocab::SortedVocab;
use super::{MaskCache, Refused};

/// The tag that opens a call.
pub const OPEN: &str = "<tool_call>";
/// The tag that closes one.
pub const CLOSE: &str = "</tool_call>";

/// The literal runs of the format: the first opening tag and its newline; after a call object, the closing tag;
/// after that, where another call may follow, the next opening tag (the end of the reply is allowed there too).
const LITERALS: [&[u8]; 3] = [b"<tool_call>\n", b"\n</tool_call>", b"\n<tool_call>\n"];
const FIRST: u8 = 0;
const CLOSING: u8 = 1;
const NEXT: u8 = 2;

/// How a template has its model write a call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CallSyntax {
    /// `<tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>`, calls on separate lines, after any words.
    Hermes,
    /// `{"name": ..., "parameters": {...}}`: one call, the whole reply.
    Llama3,
}

impl CallSyntax {
    /// The key of a call's arguments.
    pub fn arguments_key(self) -> &'static str {
        match self {
            CallSyntax::Hermes => "arguments",
            CallSyntax::Llama3 => "parameters",
        }
    }
}

/// What a reply must look like.
#[derive(Debug, PartialEq)]
pub struct NativeCalls {
    pub syntax: CallSyntax,
    /// One call object: `{"name": ..., "<arguments key>": {...}}`, one alternative per allowed tool.
    pub call: Arc<JsonSchema>,
    /// Words may come first, and the reply may be words alone (the `auto` choice); otherwise it begins with a call.
    pub lazy: bool,
    /// Most calls in one reply (at least 1).
    pub max_calls: u8,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum At {
    /// Free text, of which the last `matched` bytes begin the opening tag.
    Free { matched: u8 },
    /// A bare call's reply before its first byte, which decides between a call and words.
    Start,
    /// Free text in which no call can begin any more.
    Words,
    /// Inside literal run `lit` of [`LITERALS`] after `pos` bytes.
    Literal { lit: u8, pos: u8 },
    /// Inside a call object.
    Call(SchemaMachine),
    /// After the last call allowed.
    End,
}

/// Where a reply in a template's call format is; a `Copy` value compared whole, as the mask cache needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NativeCallsMachine {
    at: At,
    /// Calls closed so far.
    calls: u8,
}

impl NativeCallsMachine {
    pub fn new(spec: &NativeCalls) -> NativeCallsMachine {
        let at = match (spec.syntax, spec.lazy) {
            (CallSyntax::Hermes, true) => At::Free { matched: 0 },
            (CallSyntax::Hermes, false) => At::Literal { lit: FIRST, pos: 0 },
            (CallSyntax::Llama3, true) => At::Start,
            (CallSyntax::Llama3, false) => At::Call(SchemaMachine::new(&spec.call)),
        };
        NativeCallsMachine { at, calls: 0 }
    }

    /// Whether the reply may end here: in free text (lazy), or after a call's closing tag.
    pub fn is_accepting(&self) -> bool {
        matches!(self.at, At::Free { .. } | At::Start | At::Words | At::Literal { lit: NEXT, pos: 0 } | At::End)
    }

    /// Whether more text can follow.
    pub fn is_open(&self) -> bool {
        self.at != At::End
    }

    /// Calls closed so far.
    pub fn calls(&self) -> u8 {
        self.calls
    }

    /// The call object's room inside a plain string ([`SchemaMachine::plain_string`]).
    pub fn plain_string(&self, spec: &NativeCalls) -> Option<u32> {
        match &self.at {
            At::Call(m) => m.plain_string(&spec.call),
            _ => None,
        }
    }

    /// Accepts every byte of `bytes`, or returns `false` at the first refused one.
    pub fn feed(&mut self, spec: &NativeCalls, bytes: &[u8]) -> bool {
        bytes.iter().all(|&b| self.step(spec, b))
    }

    /// Accepts `b` if the reply so far plus `b` can still be one of the format, and says whether it did. A refused
    /// byte leaves the machine unchanged.
    pub fn step(&mut self, spec: &NativeCalls, b: u8) -> bool {
        let open = OPEN.as_bytes();
        match &mut self.at {
            At::Free { matched } => {
                let m = usize::from(*matched);
                if open[m] == b {
                    if m + 1 == open.len() {
                        // The words end where the tag began; its newline is left.
                        self.at = At::Literal { lit: FIRST, pos: open.len() as u8 };
                    } else {
                        *matched += 1;
                    }
                } else {
                    // The tag has no repeated prefix ('<' appears only at its start), so a mismatch restarts the
                    // match at this byte.
                    *matched = u8::from(b == open[0]);
                }
                true
            }
            At::Start if b == b'{' => {
                let mut m = SchemaMachine::new(&spec.call);
                let took = m.step(&spec.call, b);
                debug_assert!(took, "a call is an object");
                self.at = At::Call(m);
                true
            }
            At::Start | At::Words => {
                self.at = At::Words;
                true
            }
            At::Literal { lit, pos } => {
                let text = LITERALS[usize::from(*lit)];
                if text[usize::from(*pos)] != b {
                    return false;
                }
                *pos += 1;
                if usize::from(*pos) == text.len() {
                    self.at = match *lit {
                        CLOSING => {
                            self.calls += 1;
                            if self.calls < spec.max_calls { At::Literal { lit: NEXT, pos: 0 } } else { At::End }
                        }
                        _ => At::Call(SchemaMachine::new(&spec.call)),
                    };
                }
                true
            }
            At::Call(m) => {
                if !m.step(&spec.call, b) {
                    return false;
                }
                if m.is_complete() {
                    self.at = match spec.syntax {
                        CallSyntax::Hermes => At::Literal { lit: CLOSING, pos: 0 },
                        CallSyntax::Llama3 => {
                            self.calls += 1;
                            At::End
                        }
                    };
                }
                true
            }
            At::End => false,
        }
    }
}

/// One sequence's constraint to a template's call format: the machine and masks of the states it met recently.
#[derive(Debug)]
pub struct NativeCallsConstraint {
    vocab: Arc<SortedVocab>,
    spec: Arc<NativeCalls>,
    machine: NativeCallsMachine,
    /// An end-of-generation token was taken.
    ended: bool,
    cache: MaskCache<NativeCallsMachine>,
    states: Vec<NativeCallsMachine>,
}

impl NativeCallsConstraint {
    pub fn new(vocab: Arc<SortedVocab>, spec: Arc<NativeCalls>) -> NativeCallsConstraint {
        NativeCallsConstraint {
            vocab,
            machine: NativeCallsMachine::new(&spec),
            spec,
            ended: false,
            cache: MaskCache::new(),
            states: Vec::new(),
        }
    }

    /// The tokens allowed next: those whose bytes keep the reply in the format, and the end-of-generation tokens
    /// where it may end. In free text that is every token with text, except those that would open a call badly.
    pub fn mask(&mut self) -> &[u64] {
        let (spec, machine, vocab, states) = (&*self.spec, &self.machine, &self.vocab, &mut self.states);
        self.cache.get(self.machine, |mask| {
            vocab.fill_mask(machine, machine.plain_string(spec), |m, b| m.step(spec, b), mask, states);
            if machine.is_accepting() {
                for &id in vocab.eog() {
                    mask[id as usize / 64] |= 1 << (id % 64);
                }
            }
        })
    }

    /// Advances past `token` (its bytes as the tokenizer decodes them), which must be allowed.
    pub fn accept(&mut self, token: u32, bytes: &[u8]) -> Result<(), Refused> {
        if self.vocab.eog().contains(&token) {
            if self.ended || !self.machine.is_accepting() {
                return Err(Refused { token });
            }
            self.ended = true;
            return Ok(());
        }
        let mut next = self.machine;
        if self.ended || bytes.is_empty() || !next.feed(&self.spec, bytes) {
            return Err(Refused { token });
        }
        self.machine = next;
        Ok(())
    }

    /// Whether generation should end: an end-of-generation token was taken, or the last call allowed closed.
    pub fn is_complete(&self) -> bool {
        self.ended || !self.machine.is_open()
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn spec(lazy: bool, max_calls: u8) -> NativeCalls {
        let call = json!({"anyOf": [
            {"type": "object", "properties": {"name": {"const": "w"}, "arguments": {"type": "object",
             "properties": {"city": {"type": "string"}}, "required": ["city"], "additionalProperties": false}},
             "required": ["name", "arguments"], "additionalProperties": false},
            {"type": "object", "properties": {"name": {"const": "t"}, "arguments": {"type": "object",
             "properties": {}, "additionalProperties": false}},
             "required": ["name", "arguments"], "additionalProperties": false},
        ]});
        NativeCalls { syntax: CallSyntax::Hermes, call: Arc::new(JsonSchema::compile(&call).unwrap()), lazy, max_calls }
    }

    /// The machine after `text`, `None` if a byte is refused.
    fn run(spec: &NativeCalls, text: &str) -> Option<NativeCallsMachine> {
        let mut m = NativeCallsMachine::new(spec);
        m.feed(spec, text.as_bytes()).then_some(m)
    }

    const W: &str = "<tool_call>\n{\"name\": \"w\", \"arguments\": {\"city\": \"Oslo\"}}\n</tool_call>";
    const T: &str = "<tool_call>\n{\"name\": \"t\", \"arguments\": {}}\n</tool_call>";

    #[test]
    fn a_required_call_is_one_tagged_object_of_a_tool() {
        let s = spec(false, 1);
        let m = run(&s, W).unwrap();
        assert!(m.is_accepting() && !m.is_open() && m.calls() == 1);
        assert!(!NativeCallsMachine::new(&s).is_accepting(), "a call is required");
        for bad in [
            "Sure! <tool_call>",
            "<tool_call>{",
            "<tool_call>\n{\"name\": \"x\"",
            "<tool_call>\n{\"name\": \"w\", \"arguments\": {\"town\"",
            "<tool_call>\n{\"name\": \"t\", \"arguments\": {}}</tool_call>",
        ] {
            assert!(run(&s, bad).is_none(), "{bad:?}");
        }
        assert!(run(&s, &format!("{W}\n")).is_none(), "one call only");
        let inside = run(&s, "<tool_call>\n{\"name\": \"w\", \"arguments\": {\"city\": \"Os").unwrap();
        assert!(!inside.is_accepting() && inside.plain_string(&s).is_some());
    }

    #[test]
    fn parallel_calls_follow_each_other_up_to_the_limit() {
        let s = spec(false, 2);
        let one = run(&s, W).unwrap();
        assert!(one.is_accepting() && one.is_open(), "another call may follow, or the end");
        let two = run(&s, &format!("{W}\n{T}")).unwrap();
        assert!(two.is_accepting() && !two.is_open() && two.calls() == 2);
        assert!(run(&s, &format!("{W}\n{T}\n")).is_none());
        assert!(run(&s, &format!("{W}\n\n")).is_none());
    }

    #[test]
    fn lazy_replies_are_free_until_the_tag() {
        let s = spec(true, 2);
        let start = NativeCallsMachine::new(&s);
        assert!(start.is_accepting(), "words alone are a reply");
        for words in ["It is sunny.", "a < b, <tool_ and <tool_call", "<<tool_call", "x <tool_cal>"] {
            let m = run(&s, words).unwrap_or_else(|| panic!("{words:?}"));
            assert!(m.is_accepting() && m.calls() == 0, "{words:?}");
        }
        let m = run(&s, &format!("Let me look. {W}")).unwrap();
        assert!(m.is_accepting() && m.calls() == 1);
        assert!(run(&s, "Let me look. <tool_call>\n{\"name\": \"q\"").is_none(), "an undeclared tool");
        assert!(run(&s, "<<tool_call>x").is_none(), "the tag opens a call");
        let open = run(&s, "words <tool_call>").unwrap();
        assert!(!open.is_accepting(), "an opened call must be written");
        assert!(run(&s, &format!("{W} and more words")).is_none(), "calls end the reply");
    }

    #[test]
    fn a_bare_call_is_the_whole_reply_or_none_of_it() {
        let call = json!({"anyOf": [{"type": "object", "properties": {"name": {"const": "w"}, "parameters": {
            "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}},
            "required": ["name", "parameters"]}]});
        let call = Arc::new(JsonSchema::compile(&call).unwrap());
        let bare = |lazy| NativeCalls { syntax: CallSyntax::Llama3, call: call.clone(), lazy, max_calls: 1 };
        let text = "{\"name\": \"w\", \"parameters\": {\"city\": \"Oslo\"}}";
        for lazy in [false, true] {
            let s = bare(lazy);
            let m = run(&s, text).unwrap();
            assert!(m.is_accepting() && !m.is_open() && m.calls() == 1);
            assert!(run(&s, &format!("{text} ")).is_none(), "the call is the whole reply");
            assert!(run(&s, "{\"name\": \"x\"").is_none());
            assert_eq!(NativeCallsMachine::new(&s).is_accepting(), lazy, "an empty reply is words only under auto");
        }
        assert!(run(&bare(false), "Sure").is_none());
        let words = run(&bare(true), "Sure: {\"name\": \"x\"} is not a call here").unwrap();
        assert!(words.is_accepting() && words.is_open() && words.calls() == 0);
    }
}
