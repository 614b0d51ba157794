//! GBNF grammars (llama.cpp's `--grammar` format): parsed and compiled into byte-level rules that
//! [`super::grammar_machine`] runs.
//!
//! The syntax is llama.cpp's: `name ::= alternatives`, with `|`, grouping `( )`, literals `"..."`, character classes
//! `[a-z]` and `[^"\\]`, the any-character `.`, repetition `*`, `+`, `?`, `{m}`, `{m,}`, `{m,n}`, `{,n}`, and `#`
//! comments. A rule may run over several lines; the next rule begins where a name is followed by `::=`. The
//! grammar's text is matched from the rule `root`.
//!
//! Characters are Unicode scalar values, but tokens are bytes, and a token may end inside a character. So classes
//! compile to UTF-8 byte sequences (`regex-syntax`'s [`Utf8Sequences`]), and the compiled grammar has only byte sets
//! and rule references: the machine never decodes. Groups, classes beyond ASCII and repetitions become rules of
//! their own (named after the rule they came from, for messages), a repetition as right recursion so that a long
//! run does not deepen the machine's stacks.

use std::collections::HashMap;
use std::fmt;

use regex_syntax::utf8::Utf8Sequences;

/// The most a counted repetition (`{m,n}`) may ask for: each count is a copy of the item in the compiled rules.
pub const MAX_REPEAT: u32 = 1000;
/// The most elements a compiled grammar may have (its size after repetitions are written out).
pub const MAX_ELEMENTS: usize = 1 << 20;
/// The most bytes of grammar text.
pub const MAX_SOURCE: usize = 1 << 20;
/// The most repetition operators in a row on one item (`"a"?*`): each nests the item once more.
const MAX_OPERATORS: usize = 4;

/// One element of a compiled alternative.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Elem {
    /// One byte from the set (an index into [`Grammar::sets`]).
    Byte(u32),
    /// A match of the rule.
    Rule(u32),
    /// The end of an alternative.
    End,
}

/// A compiled rule: where each of its alternatives starts in [`Grammar::elems`].
#[derive(Debug, Clone)]
pub struct Rule {
    /// The rule's name as written, or for a rule the compiler made, the written rule it came from.
    pub name: String,
    /// Whether the grammar's text named it (rather than the compiler making it for a group, class or repetition).
    pub written: bool,
    pub alts: Vec<u32>,
}

/// A grammar compiled to byte-level rules, with the text it came from.
#[derive(Debug, Clone)]
pub struct Grammar {
    source: String,
    /// Every alternative's elements, each alternative ending in [`Elem::End`].
    pub elems: Vec<Elem>,
    /// Byte sets: bit `b % 64` of word `b / 64`.
    pub sets: Vec<[u64; 4]>,
    pub rules: Vec<Rule>,
    pub root: u32,
}

impl PartialEq for Grammar {
    fn eq(&self, other: &Grammar) -> bool {
        self.source == other.source
    }
}

/// Why a grammar was refused, and where.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GrammarError {
    #[error("line {line}, column {column}: {message}")]
    Syntax { line: usize, column: usize, message: String },
    #[error("line {line}, column {column}: rule `{name}` is used but not defined")]
    Undefined { line: usize, column: usize, name: String },
    #[error("rule `{name}` is defined twice (lines {first} and {second})")]
    Duplicate { name: String, first: usize, second: usize },
    #[error("the grammar has no rule `root` (generation starts there)")]
    NoRoot,
    #[error(
        "rule `{0}` is left-recursive: it can reach itself again without reading a character (e.g. `a ::= a \"x\"`, \
         or a repetition of something that can be empty); write the recursion on the right"
    )]
    LeftRecursive(String),
    #[error("the grammar is too large once repetitions are written out (more than {MAX_ELEMENTS} elements)")]
    TooLarge,
    #[error(
        "the grammar's start has too many alternatives to follow at once (more than {} stacks or {} entries) or \
         nests deeper than {}",
        super::grammar_machine::MAX_STACKS,
        super::grammar_machine::MAX_STEP_ENTRIES,
        super::grammar_machine::MAX_DEPTH
    )]
    TooAmbiguous,
    #[error("the grammar text is {0} bytes; the limit is {MAX_SOURCE}")]
    TooLong(usize),
}

/// Parsed, before compiling.
#[derive(Debug, Clone)]
enum Node {
    Seq(Vec<Node>),
    Alt(Vec<Node>),
    /// UTF-8 bytes to match exactly.
    Literal(Vec<u8>),
    /// Inclusive code point ranges (already complemented where the class was negated).
    Class(Vec<(u32, u32)>),
    Ref {
        name: String,
        at: usize,
    },
    Repeat {
        item: Box<Node>,
        min: u32,
        max: Option<u32>,
    },
}

/// The largest Unicode scalar value.
const MAX_CHAR: u32 = 0x10_FFFF;

impl Grammar {
    /// Parses and compiles GBNF text.
    pub fn parse(source: &str) -> Result<Grammar, GrammarError> {
        if source.len() > MAX_SOURCE {
            return Err(GrammarError::TooLong(source.len()));
        }
        let mut p = Parser { src: source.as_bytes(), pos: 0 };
        let defs = p.rules()?;
        let mut index: HashMap<&str, (u32, usize)> = HashMap::new();
        for (i, (name, at, _)) in defs.iter().enumerate() {
            if let Some(&(_, first)) = index.get(name.as_str()) {
                let line = |at| p.line_col(at).0;
                return Err(GrammarError::Duplicate { name: name.clone(), first: line(first), second: line(*at) });
            }
            index.insert(name, (i as u32, *at));
        }
        let root = index.get("root").ok_or(GrammarError::NoRoot)?.0;
        let mut c = Compiler {
            elems: Vec::new(),
            sets: Vec::new(),
            set_index: HashMap::new(),
            rules: defs
                .iter()
                .map(|(name, _, _)| Rule { name: name.clone(), written: true, alts: Vec::new() })
                .collect(),
            index: &index,
            parser: &p,
            owner: String::new(),
        };
        for (i, (name, _, body)) in defs.iter().enumerate() {
            c.owner = name.clone();
            let alts = match body {
                Node::Alt(alts) => alts.iter().map(|a| c.alternative(a)).collect::<Result<Vec<_>, _>>()?,
                other => vec![c.alternative(other)?],
            };
            c.rules[i].alts = alts;
        }
        let g = Grammar { source: source.to_string(), elems: c.elems, sets: c.sets, rules: c.rules, root };
        g.check_left_recursion()?;
        let g = std::sync::Arc::new(g);
        if !super::grammar_machine::GrammarMachine::start_fits(&g) {
            return Err(GrammarError::TooAmbiguous);
        }
        Ok(std::sync::Arc::unwrap_or_clone(g))
    }

    /// The text the grammar was compiled from.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// Whether byte set `set` holds `b`.
    #[inline]
    pub fn set_has(&self, set: u32, b: u8) -> bool {
        self.sets[set as usize][usize::from(b >> 6)] >> (b & 63) & 1 == 1
    }

    /// Which rules can match the empty text. A worklist over the alternatives, so that a long chain of rules costs
    /// one pass rather than one pass per link.
    fn nullable(&self) -> Vec<bool> {
        let mut null = vec![false; self.rules.len()];
        // Per alternative (its owner and the rule references not yet known to be nullable; `None` if it has a
        // byte); per rule, the alternatives that reference it, once per reference.
        let mut alts: Vec<(usize, Option<usize>)> = Vec::new();
        let mut users: Vec<Vec<usize>> = vec![Vec::new(); self.rules.len()];
        let mut queue = Vec::new();
        for (r, rule) in self.rules.iter().enumerate() {
            for &a in &rule.alts {
                let at = alts.len();
                let mut refs = Some(0);
                for e in self.elems[a as usize..].iter().take_while(|e| **e != Elem::End) {
                    match *e {
                        Elem::Rule(x) => {
                            users[x as usize].push(at);
                            refs = refs.map(|n| n + 1);
                        }
                        _ => refs = None,
                    }
                }
                if refs == Some(0) && !null[r] {
                    null[r] = true;
                    queue.push(r);
                }
                alts.push((r, refs));
            }
        }
        while let Some(x) = queue.pop() {
            for &at in &users[x] {
                let (owner, refs) = &mut alts[at];
                if let Some(n) = refs {
                    *n -= 1;
                    if *n == 0 && !null[*owner] {
                        null[*owner] = true;
                        queue.push(*owner);
                    }
                }
            }
        }
        null
    }

    /// Refuses a rule that can come back to itself before reading a byte: the machine would expand it forever.
    fn check_left_recursion(&self) -> Result<(), GrammarError> {
        let null = self.nullable();
        // The rules each rule can begin with (at a place everything before which can be empty).
        let firsts: Vec<Vec<u32>> = self
            .rules
            .iter()
            .map(|rule| {
                let mut out = Vec::new();
                for &a in &rule.alts {
                    for e in &self.elems[a as usize..] {
                        match *e {
                            Elem::Rule(x) => {
                                out.push(x);
                                if !null[x as usize] {
                                    break;
                                }
                            }
                            Elem::Byte(_) | Elem::End => break,
                        }
                    }
                }
                out
            })
            .collect();
        // Depth-first search for a cycle (0 = unseen, 1 = on the path, 2 = done), without recursion.
        let mut mark = vec![0u8; self.rules.len()];
        for start in 0..self.rules.len() {
            if mark[start] != 0 {
                continue;
            }
            let mut path: Vec<(usize, usize)> = vec![(start, 0)];
            mark[start] = 1;
            while let Some(&mut (r, ref mut next)) = path.last_mut() {
                if let Some(&x) = firsts[r].get(*next) {
                    *next += 1;
                    match mark[x as usize] {
                        0 => {
                            mark[x as usize] = 1;
                            path.push((x as usize, 0));
                        }
                        1 => return Err(GrammarError::LeftRecursive(self.rules[x as usize].name.clone())),
                        _ => {}
                    }
                } else {
                    mark[r] = 2;
                    path.pop();
                }
            }
        }
        Ok(())
    }
}

struct Parser<'a> {
    src: &'a [u8],
    pos: usize,
}

type Def = (String, usize, Node);

impl Parser<'_> {
    /// 1-based line and column (in characters) of byte `at`.
    fn line_col(&self, at: usize) -> (usize, usize) {
        let before = &self.src[..at.min(self.src.len())];
        let line = before.iter().filter(|&&b| b == b'\n').count() + 1;
        let start = before.iter().rposition(|&b| b == b'\n').map_or(0, |i| i + 1);
        let column = String::from_utf8_lossy(&before[start..]).chars().count() + 1;
        (line, column)
    }

    fn error<T>(&self, at: usize, message: impl Into<String>) -> Result<T, GrammarError> {
        let (line, column) = self.line_col(at);
        Err(GrammarError::Syntax { line, column, message: message.into() })
    }

    fn peek(&self) -> Option<u8> {
        self.src.get(self.pos).copied()
    }

    /// Skips whitespace (newlines included) and comments.
    fn space(&mut self) {
        while let Some(b) = self.peek() {
            match b {
                b' ' | b'\t' | b'\r' | b'\n' => self.pos += 1,
                b'#' => {
                    while self.peek().is_some_and(|b| b != b'\n') {
                        self.pos += 1;
                    }
                }
                _ => break,
            }
        }
    }

    fn is_name_byte(b: u8) -> bool {
        b.is_ascii_alphanumeric() || b == b'-' || b == b'_'
    }

    fn name(&mut self) -> Option<String> {
        let start = self.pos;
        while self.peek().is_some_and(Self::is_name_byte) {
            self.pos += 1;
        }
        (self.pos > start).then(|| String::from_utf8_lossy(&self.src[start..self.pos]).into_owned())
    }

    /// Whether a rule definition (`name ::=`) starts here.
    fn at_definition(&self) -> bool {
        let mut p = Parser { src: self.src, pos: self.pos };
        if p.name().is_none() {
            return false;
        }
        p.space();
        p.src[p.pos..].starts_with(b"::=")
    }

    fn rules(&mut self) -> Result<Vec<Def>, GrammarError> {
        let mut out = Vec::new();
        self.space();
        while self.pos < self.src.len() {
            let at = self.pos;
            let Some(name) = self.name() else {
                return self.error(at, format!("expected a rule name, found {}", self.describe_here()));
            };
            self.space();
            if !self.src[self.pos..].starts_with(b"::=") {
                return self.error(self.pos, format!("expected `::=` after `{name}`, found {}", self.describe_here()));
            }
            self.pos += 3;
            self.space();
            let body = self.alternatives(0)?;
            out.push((name, at, body));
        }
        if out.is_empty() {
            return self.error(0, "the grammar has no rules");
        }
        Ok(out)
    }

    /// What is at the current position, for a message.
    fn describe_here(&self) -> String {
        match std::str::from_utf8(&self.src[self.pos..]).ok().and_then(|s| s.chars().next()) {
            None if self.pos >= self.src.len() => "the end of the grammar".to_string(),
            None => format!("byte 0x{:02x}", self.src[self.pos]),
            Some(c) => format!("{c:?}"),
        }
    }

    /// Alternatives up to the end of the rule (the next definition or the end of the text) or, nested in
    /// parentheses, up to the closing one.
    fn alternatives(&mut self, depth: usize) -> Result<Node, GrammarError> {
        let mut alts = vec![self.sequence(depth)?];
        while self.peek() == Some(b'|') {
            self.pos += 1;
            self.space();
            alts.push(self.sequence(depth)?);
        }
        Ok(if alts.len() == 1 { alts.pop().unwrap_or(Node::Seq(Vec::new())) } else { Node::Alt(alts) })
    }

    fn sequence(&mut self, depth: usize) -> Result<Node, GrammarError> {
        let mut items = Vec::new();
        loop {
            self.space();
            let at = self.pos;
            let item = match self.peek() {
                None | Some(b'|') => break,
                Some(b')') if depth > 0 => break,
                Some(b')') => return self.error(at, "`)` without a matching `(`"),
                Some(_) if depth == 0 && self.at_definition() => break,
                Some(b'"') => self.literal()?,
                Some(b'[') => self.class()?,
                Some(b'.') => {
                    self.pos += 1;
                    Node::Class(vec![(0, MAX_CHAR)])
                }
                Some(b'(') => {
                    if depth >= 64 {
                        return self.error(at, "parentheses nested more than 64 deep");
                    }
                    self.pos += 1;
                    self.space();
                    let inner = self.alternatives(depth + 1)?;
                    if self.peek() != Some(b')') {
                        return self.error(at, "`(` is never closed");
                    }
                    self.pos += 1;
                    inner
                }
                Some(b) if Self::is_name_byte(b) => {
                    let name = self.name().unwrap_or_default();
                    Node::Ref { name, at }
                }
                Some(b'<') => {
                    return self.error(at, "token references (`<...>`) are not supported; write the text instead");
                }
                Some(_) => return self.error(at, format!("unexpected {}", self.describe_here())),
            };
            let item = self.repetitions(item)?;
            items.push(item);
        }
        Ok(if items.len() == 1 { items.pop().unwrap_or(Node::Seq(Vec::new())) } else { Node::Seq(items) })
    }

    /// Any repetition operators after an item.
    fn repetitions(&mut self, mut item: Node) -> Result<Node, GrammarError> {
        let mut repeats = 0;
        loop {
            // Operators may follow the item directly or after spaces on the same line.
            let save = self.pos;
            while matches!(self.peek(), Some(b' ' | b'\t')) {
                self.pos += 1;
            }
            let at = self.pos;
            let (min, max) = match self.peek() {
                Some(b'*') => (0, None),
                Some(b'+') => (1, None),
                Some(b'?') => (0, Some(1)),
                Some(b'{') => {
                    self.pos += 1;
                    let counts = self.counts(at)?;
                    self.pos -= 1;
                    counts
                }
                _ => {
                    self.pos = save;
                    return Ok(item);
                }
            };
            self.pos += 1;
            item = Node::Repeat { item: Box::new(item), min, max };
            repeats += 1;
            if repeats > MAX_OPERATORS {
                return self.error(at, format!("more than {MAX_OPERATORS} repetition operators on one item"));
            }
        }
    }

    /// `m}`, `m,}`, `m,n}` or `,n}` after a `{` at `open`; leaves the position after the `}`.
    fn counts(&mut self, open: usize) -> Result<(u32, Option<u32>), GrammarError> {
        let number = |p: &mut Parser| -> Result<Option<u32>, GrammarError> {
            while p.peek() == Some(b' ') {
                p.pos += 1;
            }
            let start = p.pos;
            while p.peek().is_some_and(|b| b.is_ascii_digit()) {
                p.pos += 1;
            }
            if p.pos == start {
                return Ok(None);
            }
            let text = std::str::from_utf8(&p.src[start..p.pos]).unwrap_or("");
            match text.parse::<u32>() {
                Ok(n) if n <= MAX_REPEAT => Ok(Some(n)),
                _ => p.error(start, format!("repetition count {text} is above the limit of {MAX_REPEAT}")),
            }
        };
        let min = number(self)?;
        while self.peek() == Some(b' ') {
            self.pos += 1;
        }
        let (min, max) = if self.peek() == Some(b',') {
            self.pos += 1;
            (min.unwrap_or(0), number(self)?)
        } else {
            match min {
                Some(m) => (m, Some(m)),
                None => return self.error(open, "`{` must be followed by a count: {m}, {m,}, {m,n} or {,n}"),
            }
        };
        while self.peek() == Some(b' ') {
            self.pos += 1;
        }
        if self.peek() != Some(b'}') {
            return self.error(open, "a repetition `{...}` is not closed with `}`");
        }
        self.pos += 1;
        if max.is_some_and(|max| max < min) {
            return self
                .error(open, format!("repetition {{{min},{}}} has its maximum below its minimum", max.unwrap_or(0)));
        }
        Ok((min, max))
    }

    /// One character of a literal or class, with escapes; `None` at the end of the text.
    fn char(&mut self) -> Result<Option<u32>, GrammarError> {
        let at = self.pos;
        let Some(b) = self.peek() else { return Ok(None) };
        if b != b'\\' {
            let rest = &self.src[self.pos..];
            let len = match b {
                0x00..=0x7F => 1,
                0xC0..=0xDF => 2,
                0xE0..=0xEF => 3,
                _ => 4,
            };
            let c =
                std::str::from_utf8(&rest[..len.min(rest.len())]).ok().and_then(|s| s.chars().next()).map(u32::from);
            return match c {
                Some(c) => {
                    self.pos += len;
                    Ok(Some(c))
                }
                None => self.error(at, "the grammar text is not valid UTF-8 here"),
            };
        }
        self.pos += 1;
        let Some(e) = self.peek() else { return self.error(at, "the text ends inside an escape") };
        self.pos += 1;
        let hex = |p: &mut Parser, n: usize| -> Result<Option<u32>, GrammarError> {
            let digits = p.src.get(p.pos..p.pos + n).and_then(|d| std::str::from_utf8(d).ok());
            let value = digits.and_then(|d| u32::from_str_radix(d, 16).ok().filter(|_| !d.starts_with('+')));
            match value.filter(|&v| char::from_u32(v).is_some()) {
                Some(v) => {
                    p.pos += n;
                    Ok(Some(v))
                }
                None => {
                    p.error(at, format!("`\\{}` must be followed by {n} hex digits of a Unicode character", e as char))
                }
            }
        };
        match e {
            b'n' => Ok(Some(u32::from(b'\n'))),
            b'r' => Ok(Some(u32::from(b'\r'))),
            b't' => Ok(Some(u32::from(b'\t'))),
            b'0' => Ok(Some(0)),
            b'\\' | b'"' | b'[' | b']' | b'-' | b'^' | b'\'' | b'/' => Ok(Some(u32::from(e))),
            b'x' => hex(self, 2),
            b'u' => hex(self, 4),
            b'U' => hex(self, 8),
            _ => self.error(at, format!("unknown escape `\\{}`", String::from_utf8_lossy(&[e]))),
        }
    }

    fn literal(&mut self) -> Result<Node, GrammarError> {
        let open = self.pos;
        self.pos += 1;
        let mut bytes = Vec::new();
        loop {
            match self.peek() {
                None | Some(b'\n') => return self.error(open, "a string literal is not closed with `\"`"),
                Some(b'"') => {
                    self.pos += 1;
                    return Ok(Node::Literal(bytes));
                }
                Some(_) => {
                    let c = self.char()?.unwrap_or(0);
                    let c = char::from_u32(c).unwrap_or('\u{FFFD}');
                    bytes.extend_from_slice(c.encode_utf8(&mut [0; 4]).as_bytes());
                }
            }
        }
    }

    fn class(&mut self) -> Result<Node, GrammarError> {
        let open = self.pos;
        self.pos += 1;
        let negated = self.peek() == Some(b'^');
        if negated {
            self.pos += 1;
        }
        let mut ranges = Vec::new();
        loop {
            match self.peek() {
                None => return self.error(open, "a character class is not closed with `]`"),
                Some(b']') => {
                    self.pos += 1;
                    break;
                }
                Some(_) => {
                    let at = self.pos;
                    let lo = self.char()?.unwrap_or(0);
                    let hi = if self.peek() == Some(b'-') && self.src.get(self.pos + 1) != Some(&b']') {
                        self.pos += 1;
                        match self.char()? {
                            Some(hi) => hi,
                            None => return self.error(open, "a character class is not closed with `]`"),
                        }
                    } else {
                        lo
                    };
                    if hi < lo {
                        return self.error(at, "a range in a character class ends before it starts");
                    }
                    ranges.push((lo, hi));
                }
            }
        }
        ranges.sort_unstable();
        let mut merged: Vec<(u32, u32)> = Vec::new();
        for (lo, hi) in ranges {
            match merged.last_mut() {
                Some(last) if lo <= last.1.saturating_add(1) => last.1 = last.1.max(hi),
                _ => merged.push((lo, hi)),
            }
        }
        if negated {
            let mut out = Vec::new();
            let mut next = 0u32;
            for (lo, hi) in merged {
                if lo > next {
                    out.push((next, lo - 1));
                }
                next = hi + 1;
            }
            if next <= MAX_CHAR {
                out.push((next, MAX_CHAR));
            }
            merged = out;
        }
        if merged.is_empty() {
            return self.error(open, "the character class matches no character");
        }
        Ok(Node::Class(merged))
    }
}

struct Compiler<'a> {
    elems: Vec<Elem>,
    sets: Vec<[u64; 4]>,
    set_index: HashMap<[u64; 4], u32>,
    rules: Vec<Rule>,
    index: &'a HashMap<&'a str, (u32, usize)>,
    parser: &'a Parser<'a>,
    /// The written rule being compiled (the name of the rules made for its parts).
    owner: String,
}

impl Compiler<'_> {
    fn set(&mut self, bits: [u64; 4]) -> u32 {
        let n = self.sets.len() as u32;
        *self.set_index.entry(bits).or_insert_with(|| {
            self.sets.push(bits);
            n
        })
    }

    fn byte_range(&mut self, lo: u8, hi: u8) -> Elem {
        let mut bits = [0u64; 4];
        for b in lo..=hi {
            bits[usize::from(b >> 6)] |= 1 << (b & 63);
        }
        Elem::Byte(self.set(bits))
    }

    /// A new rule (for a part of the current written rule) with these alternatives, already compiled.
    fn new_rule(&mut self, alts: Vec<u32>) -> u32 {
        self.rules.push(Rule { name: self.owner.clone(), written: false, alts });
        self.rules.len() as u32 - 1
    }

    /// Writes one alternative's elements and its end; returns where it starts.
    fn alternative(&mut self, node: &Node) -> Result<u32, GrammarError> {
        let mut items = Vec::new();
        self.items(node, &mut items)?;
        let start = self.elems.len() as u32;
        self.elems.extend(items);
        self.elems.push(Elem::End);
        if self.elems.len() > MAX_ELEMENTS {
            return Err(GrammarError::TooLarge);
        }
        Ok(start)
    }

    /// Appends the elements that match `node` to `out` (rules it needs are written to `elems` on the way).
    fn items(&mut self, node: &Node, out: &mut Vec<Elem>) -> Result<(), GrammarError> {
        if out.len() + self.elems.len() > MAX_ELEMENTS {
            return Err(GrammarError::TooLarge);
        }
        match node {
            Node::Seq(items) => {
                for item in items {
                    self.items(item, out)?;
                }
            }
            Node::Literal(bytes) => {
                for &b in bytes {
                    out.push(self.byte_range(b, b));
                }
            }
            Node::Ref { name, at } => match self.index.get(name.as_str()) {
                Some(&(r, _)) => out.push(Elem::Rule(r)),
                None => {
                    let (line, column) = self.parser.line_col(*at);
                    return Err(GrammarError::Undefined { line, column, name: name.clone() });
                }
            },
            Node::Alt(alts) => {
                let starts = alts.iter().map(|a| self.alternative(a)).collect::<Result<Vec<_>, _>>()?;
                out.push(Elem::Rule(self.new_rule(starts)));
            }
            Node::Class(ranges) => out.push(self.class(ranges)?),
            Node::Repeat { item, min, max } => {
                let one = self.single(item)?;
                for _ in 0..*min {
                    out.push(one);
                }
                match max {
                    // `x*` as `r ::= x r | ε`.
                    None => {
                        let r = self.rules.len() as u32;
                        self.rules.push(Rule { name: self.owner.clone(), written: false, alts: Vec::new() });
                        let again = self.elems.len() as u32;
                        self.elems.extend([one, Elem::Rule(r), Elem::End]);
                        let empty = self.elems.len() as u32;
                        self.elems.push(Elem::End);
                        self.rules[r as usize].alts = vec![again, empty];
                        out.push(Elem::Rule(r));
                    }
                    // Up to `max - min` more: `o₁ ::= x | ε`, `oₖ ::= x oₖ₋₁ | ε`.
                    Some(max) => {
                        let mut inner: Option<u32> = None;
                        for _ in *min..*max {
                            let again = self.elems.len() as u32;
                            self.elems.push(one);
                            if let Some(i) = inner {
                                self.elems.push(Elem::Rule(i));
                            }
                            self.elems.push(Elem::End);
                            let empty = self.elems.len() as u32;
                            self.elems.push(Elem::End);
                            inner = Some(self.new_rule(vec![again, empty]));
                            if self.elems.len() > MAX_ELEMENTS {
                                return Err(GrammarError::TooLarge);
                            }
                        }
                        if let Some(i) = inner {
                            out.push(Elem::Rule(i));
                        }
                    }
                }
            }
        }
        Ok(())
    }

    /// One element that matches `node`: itself where it is one already, else a rule of its own.
    fn single(&mut self, node: &Node) -> Result<Elem, GrammarError> {
        let mut items = Vec::new();
        self.items(node, &mut items)?;
        if let [one] = items[..] {
            return Ok(one);
        }
        let start = self.elems.len() as u32;
        self.elems.extend(items);
        self.elems.push(Elem::End);
        Ok(Elem::Rule(self.new_rule(vec![start])))
    }

    /// A class as one byte set (ASCII alone) or a rule over its UTF-8 byte sequences.
    fn class(&mut self, ranges: &[(u32, u32)]) -> Result<Elem, GrammarError> {
        let mut single = [0u64; 4];
        let mut longer: Vec<Vec<(u8, u8)>> = Vec::new();
        for &(lo, hi) in ranges {
            // A bound inside the surrogate gap moves out of it (`Utf8Sequences` skips the gap inside a range).
            let lo = char::from_u32(lo).unwrap_or('\u{E000}');
            let hi = char::from_u32(hi).unwrap_or('\u{D7FF}');
            if lo > hi {
                continue;
            }
            for seq in Utf8Sequences::new(lo, hi) {
                let seq = seq.as_slice();
                if let [r] = seq {
                    for b in r.start..=r.end {
                        single[usize::from(b >> 6)] |= 1 << (b & 63);
                    }
                } else {
                    longer.push(seq.iter().map(|r| (r.start, r.end)).collect());
                }
            }
        }
        if longer.is_empty() {
            return Ok(Elem::Byte(self.set(single)));
        }
        let mut starts = Vec::new();
        if single != [0; 4] {
            let e = Elem::Byte(self.set(single));
            starts.push(self.elems.len() as u32);
            self.elems.extend([e, Elem::End]);
        }
        for seq in longer {
            let items: Vec<Elem> = seq.iter().map(|&(lo, hi)| self.byte_range(lo, hi)).collect();
            starts.push(self.elems.len() as u32);
            self.elems.extend(items);
            self.elems.push(Elem::End);
        }
        if self.elems.len() > MAX_ELEMENTS {
            return Err(GrammarError::TooLarge);
        }
        Ok(Elem::Rule(self.new_rule(starts)))
    }
}

impl fmt::Display for Grammar {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.source)
    }
}

impl serde::Serialize for Grammar {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.source)
    }
}

impl<'de> serde::Deserialize<'de> for Grammar {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Grammar, D::Error> {
        let text = String::deserialize(d)?;
        Grammar::parse(&text).map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::structured::grammar_machine::{GrammarMachine, MAX_DEPTH, MAX_STACKS};

    /// How the grammar takes `text`: `None` if a byte is refused, else whether the text is a whole match and
    /// whether more can follow.
    fn run(g: &str, text: &str) -> Option<(bool, bool)> {
        let mut m = GrammarMachine::new(Arc::new(Grammar::parse(g).unwrap_or_else(|e| panic!("{g}: {e}"))));
        let start = m.start();
        let s = m.feed(start, text.as_bytes())?;
        Some((m.is_accepting(s), m.is_open(s)))
    }

    fn whole(g: &str, text: &str) -> bool {
        run(g, text).is_some_and(|(done, _)| done)
    }

    fn error(g: &str) -> String {
        match Grammar::parse(g) {
            Ok(_) => panic!("{g:?} compiled"),
            Err(e) => e.to_string(),
        }
    }

    #[test]
    fn alternatives_literals_and_sequences() {
        let g = r#"root ::= ("yes" | "no") "." "#;
        assert_eq!(run(g, "yes."), Some((true, false)));
        assert_eq!(run(g, "no"), Some((false, true)));
        assert_eq!(run(g, ""), Some((false, true)));
        assert_eq!(run(g, "yes!"), None);
        assert_eq!(run(g, "maybe"), None);
    }

    #[test]
    fn classes_cover_utf8_and_negation() {
        let g = "root ::= [а-яё]+";
        assert!(whole(g, "привет"));
        assert!(whole(g, "ёж"));
        assert_eq!(run(g, "hello"), None);
        // A character cut in the middle is a prefix, not a match.
        assert_eq!(run(g, "п\u{0}").map(|_| ()), None);
        assert_eq!(run(g, std::str::from_utf8(&"п".as_bytes()[..1]).unwrap_or("")), Some((false, true)));
        let quoted = r#"root ::= "\"" [^"\\]* "\"""#;
        for s in [r#""""#, r#""é 😀 ☃""#, r#""a b""#] {
            assert!(whole(quoted, s), "{s}");
        }
        assert_eq!(run(quoted, r#""a"b"#), None);
        assert_eq!(run(quoted, r#""\"#), None);
        // `.` takes any character, of any length in UTF-8, and no byte that cannot start or continue one.
        let mut m = GrammarMachine::new(Arc::new(Grammar::parse("root ::= .").unwrap()));
        let start = m.start();
        for c in ['a', 'é', '☃', '😀'] {
            let s = m.feed(start, c.to_string().as_bytes()).unwrap();
            assert!(m.is_accepting(s) && !m.is_open(s), "{c}");
        }
        for bytes in [&[0xFFu8][..], &[0x80], &[0xED, 0xA0, 0x80], &[0xC0, 0x80]] {
            assert_eq!(m.feed(start, bytes), None, "{bytes:x?}");
        }
    }

    #[test]
    fn escapes() {
        let g = r#"root ::= "\x41\u00e9\U0001F600\n\t\\" [\x30-\x39\]]"#;
        assert!(whole(g, "Aé😀\n\t\\5"));
        assert!(whole(g, "Aé😀\n\t\\]"));
    }

    #[test]
    fn counted_repetitions() {
        let g = r#"root ::= "a"{2,3}"#;
        assert_eq!(run(g, "a"), Some((false, true)));
        assert_eq!(run(g, "aa"), Some((true, true)));
        assert_eq!(run(g, "aaa"), Some((true, false)));
        assert_eq!(run(g, "aaaa"), None);
        assert!(whole(r#"root ::= "ab"{3}"#, "ababab"));
        assert_eq!(run(r#"root ::= "ab"{3}"#, "abab"), Some((false, true)));
        assert_eq!(run(r#"root ::= "x"{2,}"#, "x"), Some((false, true)));
        assert_eq!(run(r#"root ::= "x"{2,}"#, &"x".repeat(500)), Some((true, true)));
        assert_eq!(run(r#"root ::= "x"{,2}"#, ""), Some((true, true)));
        assert_eq!(run(r#"root ::= "x"{,2}"#, "xxx"), None);
        assert_eq!(run(r#"root ::= ("a" "b"?)*"#, "aabab"), Some((true, true)));
    }

    #[test]
    fn a_long_repetition_does_not_deepen_the_stacks() {
        let g = Arc::new(Grammar::parse(r#"root ::= item* "." item ::= [a-z] | " ""#).unwrap());
        let mut m = GrammarMachine::new(g);
        let mut s = m.start();
        for b in "lorem ipsum dolor sit amet ".repeat(400).bytes() {
            s = m.step(s, b).unwrap();
        }
        assert!(m.n_states() < 10, "{} states", m.n_states());
        let end = m.step(s, b'.').unwrap();
        assert!(m.is_accepting(end));
    }

    #[test]
    fn nesting_past_the_depth_limit_is_refused_not_a_crash() {
        let g = r#"root ::= "(" root ")" | "x""#;
        let deep = MAX_DEPTH / 2;
        let text = format!("{}x{}", "(".repeat(deep), ")".repeat(deep));
        assert!(whole(g, &text));
        assert_eq!(run(g, &"(".repeat(MAX_DEPTH + 1)), None);
    }

    /// A fuzz finding (fuzz/artifacts/grammar/timeout-7bb8607...): alternatives that overlap at every byte fork the
    /// stacks without end; each step's work is bounded, so a long text is refused quickly instead of taking seconds.
    #[test]
    fn an_ambiguous_grammar_is_cut_off_not_slow() {
        let g = r#"root ::= "(" root* ")" | [^(!]+ "(" root ")" | [^()]+"#;
        let mut m = GrammarMachine::new(Arc::new(Grammar::parse(g).unwrap()));
        let mut s = m.start();
        let mut taken = 0;
        for b in "((hello= (root)* world ((x)) y)".repeat(20).bytes() {
            if let Some(next) = m.step(s, b) {
                s = next;
                taken += 1;
            }
        }
        assert!(taken > 10, "{taken}");
        assert!(m.n_states() < 5000, "{}", m.n_states());
    }

    #[test]
    fn rules_span_lines_and_comments() {
        let g = "# a list\nroot ::= item\n  (\",\" item)*   # more\n\nitem ::=\n  [0-9]+\n  | \"none\"\n";
        assert!(whole(g, "1,22,none,3"));
        assert_eq!(run(g, "1,,"), None);
    }

    #[test]
    fn starting_over_keeps_the_current_state() {
        let mut m = GrammarMachine::new(Arc::new(Grammar::parse(r#"root ::= "ab" [0-9]+ "c""#).unwrap()));
        let start = m.start();
        let s = m.feed(start, b"ab12").unwrap();
        let s = m.start_over(s);
        assert_eq!(m.n_states(), 1);
        let end = m.feed(s, b"3c").unwrap();
        assert!(m.is_accepting(end) && !m.is_open(end));
        assert_eq!(m.feed(s, b"a"), None);
    }

    #[test]
    fn refusals_name_what_is_wrong_and_where() {
        for (g, needle) in [
            ("root ::= foo", "line 1, column 10: rule `foo` is used but not defined"),
            ("a ::= \"x\"", "no rule `root`"),
            ("root ::= \"a\"\nroot ::= \"b\"", "rule `root` is defined twice (lines 1 and 2)"),
            ("root ::= root \"a\" | \"b\"", "rule `root` is left-recursive"),
            ("root ::= a\na ::= b \"x\"\nb ::= \"\"? a", "left-recursive"),
            ("root ::= (\"a\"?)*", "left-recursive"),
            ("root ::= \"abc", "line 1, column 10: a string literal is not closed"),
            ("root ::= [a-", "not closed with `]`"),
            ("root ::= [z-a]", "ends before it starts"),
            ("root ::= \"\\q\"", "unknown escape `\\q`"),
            ("root ::= \"\\u12\"", "4 hex digits"),
            ("root ::= \"\\uD800\"", "4 hex digits"),
            ("root ::= \"a\"{3,2}", "maximum below its minimum"),
            ("root ::= \"a\"{5000}", "above the limit of 1000"),
            ("root ::= \"a\"{x}", "must be followed by a count"),
            ("root ::= (\"a\"", "`(` is never closed"),
            ("root ::= \"a\")", "`)` without a matching `(`"),
            ("root ::= <think>", "token references"),
            ("root ::= [^\\x00-\\U0010FFFF]", "matches no character"),
            ("root \"a\"", "expected `::=` after `root`"),
            ("::= \"a\"", "expected a rule name"),
            ("", "has no rules"),
            ("root ::= \"a\" @", "line 1, column 14: unexpected '@'"),
            ("root ::= \"a\"?+?+?", "more than 4 repetition operators"),
        ] {
            let e = error(g);
            assert!(e.contains(needle), "{g:?}: {e}");
        }
        // Repetitions share the rule of their item, so size grows with the sum of the counts, not their product.
        assert!(Grammar::parse("root ::= (\"a\"{1000}){1000}").unwrap().elems.len() < 10_000);
        let big: String = (0..1100).map(|i| format!("r{i} ::= \"ab\"{{1000}}\n")).collect();
        assert!(error(&format!("root ::= r0\n{big}")).contains("too large"));
        assert!(error(&" ".repeat(MAX_SOURCE + 1)).contains("the limit is"));
        // A long chain of rules, whose nullability comes back from its last link.
        let chain: String = (0..5_000).map(|i| format!("r{i} ::= r{}\n", i + 1)).collect();
        let g = format!("root ::= r0 \"x\"\n{chain}r5000 ::= \"\"\n");
        assert!(whole(&g, "x"));
        // ... and so is the left recursion through it.
        assert!(error(&format!("root ::= r0 \"x\"\n{chain}r5000 ::= \"\" root\n")).contains("left-recursive"));
        // The start of a word list as long as the limit allows is followed; one alternative more is refused.
        let words = |n: usize| (0..n).map(|i| format!("\"w{i}\"")).collect::<Vec<_>>().join(" | ");
        assert!(Grammar::parse(&format!("root ::= {}", words(MAX_STACKS))).is_ok());
        assert!(error(&format!("root ::= {}", words(MAX_STACKS + 1))).contains("too many alternatives"));
    }

    #[test]
    fn the_grammar_round_trips_through_serde_as_its_text() {
        let g = Grammar::parse("root ::= [a-z]+").unwrap();
        let json = serde_json::to_string(&g).unwrap();
        assert_eq!(json, r#""root ::= [a-z]+""#);
        let back: Grammar = serde_json::from_str(&json).unwrap();
        assert_eq!(back, g);
        assert!(serde_json::from_str::<Grammar>(r#""root ::= x""#).is_err());
    }
}
