//! JSON Schema, compiled into the table of nodes the schema machine ([`super::schema_machine`]) walks.
//!
//! The subset is what generation can enforce byte by byte, and what tools send: `type` (one or a list), `properties`
//! and `required`, `additionalProperties` (a schema for objects without `properties`, a dictionary), `items`,
//! `minItems`/`maxItems`, `minLength`/`maxLength`, `minimum`/`maximum`/`exclusiveMinimum`/`exclusiveMaximum`, `enum`,
//! `const`, `anyOf` (and `oneOf`, `allOf` of one schema),
//! `$ref` into the same document (`#`, `#/$defs/…`, `#/definitions/…`, recursion included), `nullable`, and the
//! annotations that constrain nothing (`title`, `description`, `default`, `examples`, `format`, …). Any other
//! keyword is refused by name rather than ignored, so a caller never gets text that breaks a rule it asked for.
//!
//! What is generated is a subset of what the schema allows, chosen so that every prefix has a valid continuation:
//! - an object's properties come in the schema's order, each required one always and each optional one when the
//!   model writes it, and no others (extra properties are allowed by a schema, never needed);
//! - bounded numbers have no exponent, at most [`MAX_BOUNDED`]'s 15 digits before the point, and are integers
//!   within the bounds or fractions of an integer part whose every fraction is within them ([`Range`]);
//! - `enum` and `const` values, keys and dictionary keys aside, are written as serde_json writes them (no spaces, no
//!   escapes it would not use);
//! - alternatives (`anyOf`, type lists) must differ in the first byte of their values (object, array, string,
//!   number, `true`, `false`, `null`): the machine picks one at the value's first byte. Objects are the exception:
//!   object alternatives are told apart by their first declared property, which is then always written, by its
//!   name, or where several begin with the same name, by its `const`/`enum` value (a tag, as tool calls and
//!   pydantic's discriminated unions have). Alternatives that nothing of that kind tells apart, or `integer` beside
//!   `number`, are refused when the schema is compiled.

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, OnceLock};

use serde_json::{Map, Value};

use super::schema_machine::MAX_FRAMES;

/// Index of a node in [`JsonSchema::nodes`].
pub type NodeId = u16;

/// Most nodes one schema compiles to (`NodeId` is 16 bits; this leaves room and bounds the work for hostile input).
pub const MAX_NODES: usize = 4096;
/// Deepest nesting of subschemas the compiler follows (properties, items, alternatives and `$ref`s together): it
/// recurses once per level, and a long chain of references must not run a server thread out of stack.
pub const MAX_SCHEMA_DEPTH: usize = 128;
/// Most values of one `enum` (and bytes of all of them together): the machine narrows a sorted range of them.
pub const MAX_ENUM_VALUES: usize = 4096;
/// Longest `enum`/`const` value or property name as JSON text, in bytes.
pub const MAX_VALUE_TEXT: usize = 4096;

/// The numeric bounds, applied to `integer` and `number` values.
const BOUNDS: [&str; 4] = ["minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"];

/// Keywords that annotate and constrain nothing, so they are accepted and ignored.
const ANNOTATIONS: &[&str] = &[
    "$schema",
    "$id",
    "$comment",
    "$defs",
    "definitions",
    "title",
    "description",
    "default",
    "examples",
    "format",
    "deprecated",
    "readOnly",
    "writeOnly",
    "discriminator",
    "contentMediaType",
    "contentEncoding",
];

/// Why a schema cannot be used. `path` is a JSON pointer to the subschema (`""` is the whole schema).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SchemaError {
    #[error("JSON schema at '{path}': keyword `{keyword}` is not supported")]
    Unsupported { path: String, keyword: String },
    #[error("JSON schema at '{path}': `{keyword}` {problem}")]
    Invalid { path: String, keyword: String, problem: String },
    #[error("JSON schema at '{path}': {problem}")]
    Shape { path: String, problem: String },
    #[error("JSON schema: more than {MAX_NODES} subschemas")]
    TooLarge,
    #[error("JSON schema at '{path}': subschemas nest more than {MAX_SCHEMA_DEPTH} deep")]
    TooDeep { path: String },
}

/// A JSON value's kind as its first byte shows it: what alternatives are told apart by.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(super) enum Kind {
    Object,
    Array,
    String,
    Number,
    True,
    False,
    Null,
}

impl Kind {
    pub(super) const ALL: [Kind; 7] =
        [Kind::Object, Kind::Array, Kind::String, Kind::Number, Kind::True, Kind::False, Kind::Null];

    /// The kind a value starting with `b` has.
    pub(super) fn of_first_byte(b: u8) -> Option<Kind> {
        Some(match b {
            b'{' => Kind::Object,
            b'[' => Kind::Array,
            b'"' => Kind::String,
            b'-' | b'0'..=b'9' => Kind::Number,
            b't' => Kind::True,
            b'f' => Kind::False,
            b'n' => Kind::Null,
            _ => return None,
        })
    }

    fn of_value(v: &Value) -> Kind {
        match v {
            Value::Object(_) => Kind::Object,
            Value::Array(_) => Kind::Array,
            Value::String(_) => Kind::String,
            Value::Number(_) => Kind::Number,
            Value::Bool(true) => Kind::True,
            Value::Bool(false) => Kind::False,
            Value::Null => Kind::Null,
        }
    }

    fn name(self) -> &'static str {
        match self {
            Kind::Object => "an object",
            Kind::Array => "an array",
            Kind::String => "a string",
            Kind::Number => "a number",
            Kind::True => "true",
            Kind::False => "false",
            Kind::Null => "null",
        }
    }
}

/// One declared property of an object node.
#[derive(Debug, Clone)]
pub(super) struct Property {
    /// The name as JSON text, quotes included (what the model must write).
    pub key: Vec<u8>,
    pub node: NodeId,
    pub required: bool,
}

/// A compiled subschema.
#[derive(Debug, Clone)]
pub(super) enum Node {
    /// Any JSON value (`{}`, `true`, `{"type": "object"}` with nothing else): the plain JSON machine's grammar.
    Any,
    /// An unconstrained object: `{"type": "object"}` without properties or a value schema.
    AnyObject,
    Null,
    Boolean,
    /// A number; between bounds when `range` is set (the number is then written without an exponent).
    Number {
        integer: bool,
        range: Option<Range>,
    },
    /// A string of `min..=max` characters (Unicode scalar values; an escape is one character).
    String {
        min: u32,
        max: u32,
    },
    /// One of these JSON texts, sorted (`enum`, `const`), all of one [`Kind`].
    Values(Vec<Vec<u8>>),
    /// An object with declared properties, in the schema's order.
    Object(Vec<Property>),
    /// An object of any keys, each value of `value` (`additionalProperties: {schema}` without `properties`).
    Map {
        value: NodeId,
    },
    Array {
        items: NodeId,
        min: u32,
        max: u32,
    },
    /// One alternative per value kind.
    Union(Vec<(Kind, NodeId)>),
    /// Object alternatives (each an [`Node::Object`]) told apart by their first declared property, which is
    /// always written: by its name where no other alternative begins with it, else by its value, an `enum`/`const`
    /// of its own (a tag, as pydantic's discriminated unions have).
    Variants {
        /// Each first property's name (one entry per name), with the node its value follows: the alternative's own
        /// node where the name picks the alternative, else a [`Node::Values`] of every tag given under the name.
        keys: Vec<Property>,
        /// Per entry of `keys`, how the alternative is chosen.
        picks: Vec<Pick>,
        /// The alternatives, as given.
        alts: Vec<NodeId>,
    },
    /// A placeholder while a `$ref` target compiles (replaced before compilation ends).
    Pending,
}

/// Largest integer part a bounded number is written with (15 digits): the machine does exact integer arithmetic
/// on it, and every value stays exact in an f64.
pub(super) const MAX_BOUNDED: i64 = 999_999_999_999_999;

/// `minimum`/`maximum` (and the exclusive ones) compiled into which integer parts each sign may be written with,
/// as closed ranges of magnitudes (empty when the first exceeds the second). What is generated is the subset of the
/// bounded numbers made of the integers within the bounds, and of the numbers with a fraction whose integer part's
/// every fraction is within them (`1.x` for all x when 1 ≤ x < 2 fits): every prefix can be finished by checking
/// ranges of integers only.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Range {
    /// Per sign (0 `+`, 1 `-`): magnitudes `n` with `±n` itself within the bounds.
    pub points: [(i64, i64); 2],
    /// Per sign: magnitudes `n` with every `±n.ddd` within the bounds (empty for integers).
    pub cells: [(i64, i64); 2],
}

impl Range {
    /// The range of `lo`/`hi` (each a bound and whether it is exclusive); `None` if no value fits.
    fn new(integer: bool, lo: Option<(f64, bool)>, hi: Option<(f64, bool)>) -> Option<Range> {
        let max = MAX_BOUNDED as f64;
        let clamp = |x: f64| x.clamp(-max - 1.0, max + 1.0) as i64;
        // The integers within the bounds, as values.
        let vmin = clamp(lo.map_or(-max, |(x, excl)| if excl { x.floor() + 1.0 } else { x.ceil() }));
        let vmax = clamp(hi.map_or(max, |(x, excl)| if excl { x.ceil() - 1.0 } else { x.floor() }));
        let points = [(vmin.max(0), vmax), ((-vmax).max(0), -vmin)];
        // `n.ddd` lies in [n, n + 1): it needs n within the low bound and n + 1 at most the high one; `-n.ddd` lies
        // in (-n - 1, -n].
        let cells = if integer {
            [(1, 0); 2]
        } else {
            let top = clamp(hi.map_or(max, |(x, _)| x.floor() - 1.0));
            let bottom = clamp(lo.map_or(max, |(x, _)| -x.ceil() - 1.0));
            [(vmin.max(0), top), ((-vmax).max(0), bottom)]
        };
        let clip = |(a, b): (i64, i64)| (a.max(0), b.min(MAX_BOUNDED));
        let r = Range { points: points.map(clip), cells: cells.map(clip) };
        let some = |(a, b): (i64, i64)| a <= b;
        (r.points.iter().chain(&r.cells).any(|&p| some(p))).then_some(r)
    }

    /// Whether some value of sign `neg` whose integer part is `mag` followed by `more` (a flag) or `0..` further
    /// digits can be finished within the bounds: `mag` itself, a fraction of it, or a longer integer part.
    pub(super) fn reachable(&self, integer: bool, neg: bool, mag: i64, more: bool) -> bool {
        let s = usize::from(neg);
        let hits = |lo: i64, hi: i64| {
            let meet = |(a, b): (i64, i64)| a <= b && a <= hi && lo <= b;
            meet(self.points[s]) || (!integer && meet(self.cells[s]))
        };
        if hits(mag, mag) {
            return true;
        }
        if !more || mag == 0 {
            return false;
        }
        // j more digits: mag·10^j ..= (mag + 1)·10^j − 1.
        let (mut lo, mut hi) = (mag, mag);
        loop {
            lo = match lo.checked_mul(10) {
                Some(x) if x <= MAX_BOUNDED => x,
                _ => return false,
            };
            hi = (hi.saturating_mul(10) + 9).min(MAX_BOUNDED);
            if hits(lo, hi) {
                return true;
            }
        }
    }

    /// Whether a value of sign `neg` can be written at all (after a lone `-`, or before the first byte).
    pub(super) fn any(&self, integer: bool, neg: bool) -> bool {
        let s = usize::from(neg);
        self.points[s].0 <= self.points[s].1 || (!integer && self.cells[s].0 <= self.cells[s].1)
    }

    pub(super) fn point(&self, neg: bool, mag: i64) -> bool {
        let (a, b) = self.points[usize::from(neg)];
        a <= mag && mag <= b
    }

    pub(super) fn cell(&self, neg: bool, mag: i64) -> bool {
        let (a, b) = self.cells[usize::from(neg)];
        a <= mag && mag <= b
    }
}

/// How a [`Node::Variants`] picks its alternative after one of its first-property names.
#[derive(Debug, Clone)]
pub(super) enum Pick {
    /// The name alone: this alternative, which continues after its first property's name.
    Alt(NodeId),
    /// The value: text `i` of the name's `Values` node is a tag of alternative `i`, which continues after it.
    Tags(Vec<NodeId>),
}

/// A compiled schema: immutable, shared by every sequence that generates against it.
#[derive(Debug)]
pub struct JsonSchema {
    /// The schema as given (kept to save and show it).
    source: Value,
    pub(super) nodes: Vec<Node>,
    pub(super) root: NodeId,
    /// Per node, the fewest schema frames (objects and arrays of the schema's own) its smallest instance nests;
    /// [`UNBOUNDED`] when it has no finite instance. The machine opens nothing it could not finish within
    /// [`MAX_FRAMES`], so it never reaches a point where no byte can follow.
    pub(super) min_depth: Vec<u8>,
}

/// [`JsonSchema::min_depth`] of a node with no finite instance (a required property that requires itself).
pub(super) const UNBOUNDED: u8 = u8::MAX;

impl PartialEq for JsonSchema {
    fn eq(&self, other: &Self) -> bool {
        self.source == other.source
    }
}

impl fmt::Display for JsonSchema {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.source)
    }
}

impl JsonSchema {
    /// Compiles `source`. The top level may be anything but a number alone (a number has no last byte, so
    /// generation could not tell where it ends); number alternatives beside others are dropped there.
    pub fn compile(source: &Value) -> Result<JsonSchema, SchemaError> {
        let mut c = Compiler { doc: source, nodes: Vec::new(), refs: HashMap::new(), depth: 0 };
        let root = c.compile(source, "")?;
        let root = c.top_level(root)?;
        let min_depth = min_depths(&c.nodes);
        match min_depth[usize::from(root)] {
            UNBOUNDED => Err(SchemaError::Shape {
                path: String::new(),
                problem: "no finite value fits it (a required property or item requires itself)".into(),
            }),
            d if usize::from(d) > MAX_FRAMES => Err(SchemaError::Shape {
                path: String::new(),
                problem: format!(
                    "its smallest value nests {d} objects and arrays deep; at most {MAX_FRAMES} are supported"
                ),
            }),
            _ => Ok(JsonSchema { source: source.clone(), nodes: c.nodes, root, min_depth }),
        }
    }

    /// The schema of OpenAI's `json_object` format (and `--format json`): one JSON object, anything inside.
    pub fn any_object() -> Arc<JsonSchema> {
        static ANY: OnceLock<Arc<JsonSchema>> = OnceLock::new();
        ANY.get_or_init(|| Arc::new(JsonSchema::compile(&serde_json::json!({"type": "object"})).unwrap())).clone()
    }

    /// The schema as it was given.
    pub fn source(&self) -> &Value {
        &self.source
    }

    pub(super) fn node(&self, id: NodeId) -> &Node {
        &self.nodes[usize::from(id)]
    }

    /// The node a value of `node` starting with byte `b` follows (alternatives resolved), if any.
    pub(super) fn start(&self, node: NodeId, b: u8) -> Option<NodeId> {
        let kind = Kind::of_first_byte(b)?;
        match self.node(node) {
            Node::Union(alts) => alts.iter().find(|(k, _)| *k == kind).map(|&(_, n)| n),
            n if accepts(n, kind) => Some(node),
            _ => None,
        }
    }
}

impl serde::Serialize for JsonSchema {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.source.serialize(s)
    }
}

impl<'de> serde::Deserialize<'de> for JsonSchema {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let v = Value::deserialize(d)?;
        JsonSchema::compile(&v).map_err(serde::de::Error::custom)
    }
}

/// [`JsonSchema::min_depth`] of every node: a fixpoint from "unbounded" down, as recursion allows.
fn min_depths(nodes: &[Node]) -> Vec<u8> {
    let mut depth = vec![UNBOUNDED; nodes.len()];
    loop {
        let mut changed = false;
        for (i, n) in nodes.iter().enumerate() {
            let of = |id: NodeId| u32::from(depth[usize::from(id)]);
            let d = match n {
                Node::Object(props) => 1 + props.iter().filter(|p| p.required).map(|p| of(p.node)).max().unwrap_or(0),
                Node::Map { .. } => 1,
                Node::Array { items, min, .. } => 1 + if *min > 0 { of(*items) } else { 0 },
                Node::Union(alts) => alts.iter().map(|&(_, a)| of(a)).min().unwrap_or(u32::from(UNBOUNDED)),
                Node::Variants { alts, .. } => {
                    alts.iter().map(|&a| variant_depth(nodes, a, of)).min().unwrap_or(u32::from(UNBOUNDED))
                }
                Node::Pending => u32::from(UNBOUNDED),
                _ => 0,
            };
            let d = d.min(u32::from(UNBOUNDED)) as u8;
            if d < depth[i] {
                depth[i] = d;
                changed = true;
            }
        }
        if !changed {
            return depth;
        }
    }
}

/// The fewest frames an alternative of a [`Node::Variants`] nests, given `of` (each node's minimum): its own, or
/// its first property's value inside it if that is deeper (the first property is written even when optional).
pub(super) fn variant_depth(nodes: &[Node], alt: NodeId, of: impl Fn(NodeId) -> u32) -> u32 {
    let first = match &nodes[usize::from(alt)] {
        Node::Object(props) => props.first().map_or(0, |p| 1 + of(p.node)),
        _ => 0,
    };
    of(alt).max(first)
}

/// Whether a node takes a value of `kind` (what its first byte shows). A match, not a list: the machine asks at
/// every value start of every token it walks.
fn accepts(n: &Node, kind: Kind) -> bool {
    match n {
        Node::Any => true,
        Node::AnyObject | Node::Object(_) | Node::Map { .. } | Node::Variants { .. } => kind == Kind::Object,
        Node::Null => kind == Kind::Null,
        Node::Boolean => matches!(kind, Kind::True | Kind::False),
        Node::Number { .. } => kind == Kind::Number,
        Node::String { .. } => kind == Kind::String,
        Node::Values(v) => v.first().and_then(|t| t.first()).and_then(|&b| Kind::of_first_byte(b)) == Some(kind),
        Node::Array { .. } => kind == Kind::Array,
        Node::Union(alts) => alts.iter().any(|(k, _)| *k == kind),
        Node::Pending => false,
    }
}

/// The kinds of value a node takes ([`accepts`] as a list, for compiling alternatives).
fn kinds(n: &Node) -> Vec<Kind> {
    Kind::ALL.into_iter().filter(|&k| accepts(n, k)).collect()
}

struct Compiler<'a> {
    doc: &'a Value,
    nodes: Vec<Node>,
    /// `$ref` targets compiled so far (or being compiled), by pointer.
    refs: HashMap<String, NodeId>,
    /// Calls of [`Compiler::compile`] under way.
    depth: usize,
}

impl Compiler<'_> {
    fn push(&mut self, n: Node) -> Result<NodeId, SchemaError> {
        if self.nodes.len() >= MAX_NODES {
            return Err(SchemaError::TooLarge);
        }
        self.nodes.push(n);
        Ok((self.nodes.len() - 1) as NodeId)
    }

    fn compile(&mut self, s: &Value, path: &str) -> Result<NodeId, SchemaError> {
        if self.depth >= MAX_SCHEMA_DEPTH {
            return Err(SchemaError::TooDeep { path: path.into() });
        }
        self.depth += 1;
        let node = self.compile_inner(s, path);
        self.depth -= 1;
        node
    }

    fn compile_inner(&mut self, s: &Value, path: &str) -> Result<NodeId, SchemaError> {
        let o = match s {
            Value::Bool(true) => return self.push(Node::Any),
            Value::Object(o) => o,
            Value::Bool(false) => {
                return Err(SchemaError::Shape { path: path.into(), problem: "`false` allows no value".into() });
            }
            other => {
                return Err(SchemaError::Shape {
                    path: path.into(),
                    problem: format!("a schema is an object or a boolean, not {}", json_kind(other)),
                });
            }
        };
        for key in o.keys() {
            let known = ANNOTATIONS.contains(&key.as_str())
                || [
                    "type",
                    "properties",
                    "required",
                    "additionalProperties",
                    "items",
                    "minItems",
                    "maxItems",
                    "minLength",
                    "maxLength",
                    "minimum",
                    "maximum",
                    "exclusiveMinimum",
                    "exclusiveMaximum",
                    "enum",
                    "const",
                    "anyOf",
                    "oneOf",
                    "allOf",
                    "$ref",
                    "nullable",
                ]
                .contains(&key.as_str());
            if !known {
                return Err(SchemaError::Unsupported { path: path.into(), keyword: key.clone() });
            }
        }
        let invalid = |keyword: &str, problem: String| SchemaError::Invalid {
            path: path.into(),
            keyword: keyword.into(),
            problem,
        };

        // Keywords that replace the rest: a reference, a combination, a fixed set of values.
        let alone = ["$ref", "anyOf", "oneOf", "allOf", "enum", "const"];
        if let Some(k) = alone.iter().copied().find(|k| o.contains_key(*k)) {
            let others: Vec<&String> = o
                .keys()
                .filter(|x| x.as_str() != k && !ANNOTATIONS.contains(&x.as_str()) && x.as_str() != "nullable")
                .collect();
            // A `type` beside `enum`/`const` only restates the values' type (pydantic writes it); it is checked below.
            let others: Vec<&String> =
                others.into_iter().filter(|x| !(x.as_str() == "type" && matches!(k, "enum" | "const"))).collect();
            if let Some(x) = others.first() {
                return Err(SchemaError::Shape {
                    path: path.into(),
                    problem: format!("`{k}` with `{x}` beside it is not supported"),
                });
            }
            let node = match k {
                "$ref" => self.reference(o, path)?,
                "enum" | "const" => self.values(o, k, path)?,
                _ => self.alternatives(o, k, path)?,
            };
            return self.nullable(o, node, path);
        }

        let types: Vec<&str> = match o.get("type") {
            None => Vec::new(),
            Some(Value::String(t)) => vec![t.as_str()],
            Some(Value::Array(ts)) => ts
                .iter()
                .map(|t| t.as_str().ok_or_else(|| invalid("type", format!("lists {}, not a type name", json_kind(t)))))
                .collect::<Result<_, _>>()?,
            Some(v) => return Err(invalid("type", format!("must be a string or an array, not {}", json_kind(v)))),
        };
        let mut alts = Vec::new();
        if types.is_empty() {
            // No type: the value may be anything, unless keywords of one type say more.
            if o.contains_key("properties") || o.contains_key("additionalProperties") {
                alts.push(self.object(o, path)?);
            } else if o.contains_key("items") || o.contains_key("minItems") || o.contains_key("maxItems") {
                alts.push(self.array(o, path)?);
            } else if o.contains_key("minLength") || o.contains_key("maxLength") {
                alts.push(self.string(o, path)?);
            } else if BOUNDS.iter().any(|k| o.contains_key(*k)) {
                alts.push(self.number(o, false, path)?);
            } else {
                alts.push(self.push(Node::Any)?);
            }
        }
        for t in &types {
            let node = match *t {
                "object" => self.object(o, path)?,
                "array" => self.array(o, path)?,
                "string" => self.string(o, path)?,
                "integer" => self.number(o, true, path)?,
                "number" => self.number(o, false, path)?,
                "boolean" => self.push(Node::Boolean)?,
                "null" => self.push(Node::Null)?,
                other => return Err(invalid("type", format!("names an unknown type \"{other}\""))),
            };
            alts.push(node);
        }
        let node = if alts.len() == 1 { alts[0] } else { self.union(&alts, path)? };
        self.nullable(o, node, path)
    }

    /// `nullable: true` (OpenAPI's spelling of "or null").
    fn nullable(&mut self, o: &Map<String, Value>, node: NodeId, path: &str) -> Result<NodeId, SchemaError> {
        match o.get("nullable") {
            None | Some(Value::Bool(false)) => Ok(node),
            Some(Value::Bool(true)) => {
                if accepts(&self.nodes[usize::from(node)], Kind::Null) {
                    return Ok(node);
                }
                let null = self.push(Node::Null)?;
                self.union(&[node, null], path)
            }
            Some(v) => Err(SchemaError::Invalid {
                path: path.into(),
                keyword: "nullable".into(),
                problem: format!("must be a boolean, not {}", json_kind(v)),
            }),
        }
    }

    fn reference(&mut self, o: &Map<String, Value>, path: &str) -> Result<NodeId, SchemaError> {
        let Some(Value::String(r)) = o.get("$ref") else {
            return Err(SchemaError::Invalid {
                path: path.into(),
                keyword: "$ref".into(),
                problem: "must be a string".into(),
            });
        };
        if let Some(&id) = self.refs.get(r) {
            return Ok(id);
        }
        let target = r.strip_prefix('#').and_then(|p| self.doc.pointer(p)).ok_or_else(|| SchemaError::Invalid {
            path: path.into(),
            keyword: "$ref".into(),
            problem: format!("\"{r}\" does not point into this schema (only \"#...\" references are)"),
        })?;
        // The placeholder lets the target refer to itself; a chain of references with nothing between them would
        // loop, and is refused.
        let slot = self.push(Node::Pending)?;
        self.refs.insert(r.clone(), slot);
        let body = self.compile(target, &r[1..])?;
        if matches!(self.nodes[usize::from(body)], Node::Pending) {
            return Err(SchemaError::Shape { path: path.into(), problem: format!("\"{r}\" refers only to itself") });
        }
        self.nodes[usize::from(slot)] = self.nodes[usize::from(body)].clone();
        Ok(slot)
    }

    fn values(&mut self, o: &Map<String, Value>, k: &str, path: &str) -> Result<NodeId, SchemaError> {
        let invalid = |problem: String| SchemaError::Invalid { path: path.into(), keyword: k.into(), problem };
        let values: Vec<&Value> = match (k, &o[k]) {
            ("const", v) => vec![v],
            (_, Value::Array(vs)) if vs.is_empty() => return Err(invalid("lists no values".into())),
            (_, Value::Array(vs)) if vs.len() > MAX_ENUM_VALUES => {
                return Err(invalid(format!("lists {} values; at most {MAX_ENUM_VALUES} are supported", vs.len())));
            }
            (_, Value::Array(vs)) => vs.iter().collect(),
            (_, v) => return Err(invalid(format!("must be an array, not {}", json_kind(v)))),
        };
        // A `type` beside the values must admit each of them.
        if let Some(t) = o.get("type") {
            let names: Vec<&str> = match t {
                Value::String(s) => vec![s.as_str()],
                Value::Array(a) => a.iter().filter_map(Value::as_str).collect(),
                _ => Vec::new(),
            };
            for v in &values {
                let fits = names.iter().any(|n| match *n {
                    "integer" => v.is_i64() || v.is_u64(),
                    "number" => v.is_number(),
                    "string" => v.is_string(),
                    "boolean" => v.is_boolean(),
                    "null" => v.is_null(),
                    "object" => v.is_object(),
                    "array" => v.is_array(),
                    _ => false,
                });
                if !fits {
                    return Err(invalid(format!("value {v} does not have the schema's `type` {t}")));
                }
            }
        }
        let mut by_kind: Vec<(Kind, Vec<Vec<u8>>)> = Vec::new();
        for v in values {
            let text = v.to_string().into_bytes();
            if text.len() > MAX_VALUE_TEXT {
                return Err(invalid(format!("has a value of {} bytes; at most {MAX_VALUE_TEXT}", text.len())));
            }
            let kind = Kind::of_value(v);
            match by_kind.iter_mut().find(|(k, _)| *k == kind) {
                Some((_, texts)) => texts.push(text),
                None => by_kind.push((kind, vec![text])),
            }
        }
        let mut alts = Vec::new();
        for (_, mut texts) in by_kind {
            texts.sort();
            texts.dedup();
            alts.push(self.push(Node::Values(texts))?);
        }
        if alts.len() == 1 { Ok(alts[0]) } else { self.union(&alts, path) }
    }

    fn alternatives(&mut self, o: &Map<String, Value>, k: &str, path: &str) -> Result<NodeId, SchemaError> {
        let list = match &o[k] {
            Value::Array(l) if !l.is_empty() => l,
            v => {
                return Err(SchemaError::Invalid {
                    path: path.into(),
                    keyword: k.into(),
                    problem: format!("must be a non-empty array, not {}", json_kind(v)),
                });
            }
        };
        if k == "allOf" && list.len() > 1 {
            return Err(SchemaError::Invalid {
                path: path.into(),
                keyword: k.into(),
                problem: format!("with {} schemas is not supported (one is)", list.len()),
            });
        }
        let mut alts = Vec::new();
        for (i, s) in list.iter().enumerate() {
            alts.push(self.compile(s, &format!("{path}/{k}/{i}"))?);
        }
        if alts.len() == 1 { Ok(alts[0]) } else { self.union(&alts, path) }
    }

    /// Alternatives told apart by their values' first byte, and object alternatives by their first property
    /// ([`Node::Variants`]). An `Any` among them takes everything (the union is then `Any`: a value of any
    /// alternative is a value of it).
    fn union(&mut self, alts: &[NodeId], path: &str) -> Result<NodeId, SchemaError> {
        let mut by_kind: Vec<(Kind, NodeId)> = Vec::new();
        let mut objects: Vec<NodeId> = Vec::new();
        for &a in alts {
            let node = &self.nodes[usize::from(a)];
            if matches!(node, Node::Any) {
                return Ok(a);
            }
            let members: Vec<(Kind, NodeId)> = match node {
                Node::Union(m) => m.clone(),
                Node::Pending => {
                    return Err(SchemaError::Shape {
                        path: path.into(),
                        problem: "an alternative that refers back to its own union is not supported".into(),
                    });
                }
                n => kinds(n).into_iter().map(|k| (k, a)).collect(),
            };
            for (k, n) in members {
                if k == Kind::Object {
                    // Nested object alternatives join this level's.
                    let inner = match &self.nodes[usize::from(n)] {
                        Node::Variants { alts, .. } => alts.clone(),
                        _ => vec![n],
                    };
                    for o in inner {
                        if !objects.contains(&o) {
                            objects.push(o);
                        }
                    }
                    continue;
                }
                if by_kind.iter().any(|(x, m)| *x == k && *m != n) {
                    return Err(SchemaError::Shape {
                        path: path.into(),
                        problem: format!(
                            "two alternatives both allow {}; alternatives must differ in the kind of value \
                             (object, array, string, number, boolean, null), or be objects told apart by their \
                             first property",
                            k.name()
                        ),
                    });
                }
                if !by_kind.iter().any(|(x, _)| *x == k) {
                    by_kind.push((k, n));
                }
            }
        }
        match objects.len() {
            0 => {}
            1 => by_kind.insert(0, (Kind::Object, objects[0])),
            _ => {
                let variants = self.variants(&objects, path)?;
                by_kind.insert(0, (Kind::Object, variants));
            }
        }
        if by_kind.len() == 1 {
            return Ok(by_kind[0].1);
        }
        self.push(Node::Union(by_kind))
    }

    /// Object alternatives told apart by their first declared property: by its name, or where several begin with
    /// the same name, by its `enum`/`const` value (which must then differ between them).
    fn variants(&mut self, alts: &[NodeId], path: &str) -> Result<NodeId, SchemaError> {
        let shape = |problem: String| SchemaError::Shape { path: path.into(), problem };
        // Per first-property name, in the order first met: the alternatives that begin with it.
        let mut groups: Vec<(Vec<u8>, Vec<NodeId>)> = Vec::new();
        for &a in alts {
            let first = match &self.nodes[usize::from(a)] {
                Node::Object(props) => props.first().map(|p| p.key.clone()),
                Node::Pending => {
                    return Err(shape("an alternative that refers back to its own union is not supported".into()));
                }
                _ => None,
            };
            let Some(key) = first else {
                return Err(shape(
                    "an object alternative without declared properties beside other object alternatives: object \
                     alternatives are told apart by their first property"
                        .into(),
                ));
            };
            match groups.iter_mut().find(|(k, _)| *k == key) {
                Some((_, list)) => list.push(a),
                None => groups.push((key, vec![a])),
            }
        }
        if groups.len() > 64 {
            return Err(shape(format!(
                "{} object alternatives with different first properties; at most 64",
                groups.len()
            )));
        }
        let mut keys = Vec::with_capacity(groups.len());
        let mut picks = Vec::with_capacity(groups.len());
        for (key, members) in groups {
            let name = String::from_utf8_lossy(&key).into_owned();
            let first_node = |c: &Compiler, a: NodeId| match &c.nodes[usize::from(a)] {
                Node::Object(props) => props[0].node,
                _ => unreachable!("variants are objects with properties"),
            };
            if let [alt] = members[..] {
                keys.push(Property { key, node: first_node(self, alt), required: true });
                picks.push(Pick::Alt(alt));
                continue;
            }
            // Several begin with `name`: their values there tell them apart.
            let mut tags: Vec<(Vec<u8>, NodeId)> = Vec::new();
            for &alt in &members {
                let Node::Values(texts) = &self.nodes[usize::from(first_node(self, alt))] else {
                    return Err(shape(format!(
                        "{} object alternatives begin with the property {name}, and not all of them fix its value \
                         with `const` or `enum`, so nothing tells them apart",
                        members.len()
                    )));
                };
                tags.extend(texts.iter().map(|t| (t.clone(), alt)));
            }
            if tags.len() > MAX_ENUM_VALUES {
                return Err(shape(format!(
                    "the object alternatives give {name} {} values in all; at most {MAX_ENUM_VALUES}",
                    tags.len()
                )));
            }
            tags.sort();
            if let Some(w) = tags.windows(2).find(|w| w[0].0 == w[1].0) {
                return Err(shape(format!(
                    "two object alternatives both begin with {name}: {}, so nothing tells them apart",
                    String::from_utf8_lossy(&w[0].0)
                )));
            }
            let kind = |t: &[u8]| Kind::of_first_byte(t[0]);
            if tags.iter().any(|(t, _)| kind(t) != kind(&tags[0].0)) {
                return Err(shape(format!(
                    "the object alternatives' values of {name} are of different kinds; tags of one kind are supported"
                )));
            }
            let (texts, owners): (Vec<Vec<u8>>, Vec<NodeId>) = tags.into_iter().unzip();
            let node = self.push(Node::Values(texts))?;
            keys.push(Property { key, node, required: true });
            picks.push(Pick::Tags(owners));
        }
        self.push(Node::Variants { keys, picks, alts: alts.to_vec() })
    }

    fn object(&mut self, o: &Map<String, Value>, path: &str) -> Result<NodeId, SchemaError> {
        let invalid = |keyword: &str, problem: String| SchemaError::Invalid {
            path: path.into(),
            keyword: keyword.into(),
            problem,
        };
        let props = match o.get("properties") {
            None => None,
            Some(Value::Object(p)) => Some(p),
            Some(v) => return Err(invalid("properties", format!("must be an object, not {}", json_kind(v)))),
        };
        let required: Vec<&str> = match o.get("required") {
            None => Vec::new(),
            Some(Value::Array(r)) => r
                .iter()
                .map(|n| n.as_str().ok_or_else(|| invalid("required", format!("lists {}, not a name", json_kind(n)))))
                .collect::<Result<_, _>>()?,
            Some(v) => return Err(invalid("required", format!("must be an array, not {}", json_kind(v)))),
        };
        let extra = match o.get("additionalProperties") {
            None | Some(Value::Bool(_)) => None,
            Some(s @ Value::Object(_)) => Some(s),
            Some(v) => {
                return Err(invalid("additionalProperties", format!("must be a schema, not {}", json_kind(v))));
            }
        };
        let Some(props) = props.filter(|p| !p.is_empty()) else {
            if let Some(&name) = required.first() {
                return Err(invalid("required", format!("names \"{name}\", which `properties` does not declare")));
            }
            return match extra {
                Some(s) => {
                    let value = self.compile(s, &format!("{path}/additionalProperties"))?;
                    self.push(Node::Map { value })
                }
                None if o.get("additionalProperties") == Some(&Value::Bool(false)) => {
                    self.push(Node::Object(Vec::new()))
                }
                None => self.push(Node::AnyObject),
            };
        };
        if let Some(name) = required.iter().find(|n| !props.contains_key(**n)) {
            return Err(invalid("required", format!("names \"{name}\", which `properties` does not declare")));
        }
        let mut list = Vec::with_capacity(props.len());
        for (name, s) in props {
            let node = self.compile(s, &format!("{path}/properties/{}", pointer_escape(name)))?;
            let key = Value::String(name.clone()).to_string().into_bytes();
            if key.len() > MAX_VALUE_TEXT {
                return Err(invalid(
                    "properties",
                    format!("has a name of {} bytes; at most {MAX_VALUE_TEXT}", key.len()),
                ));
            }
            list.push(Property { key, node, required: required.contains(&name.as_str()) });
        }
        self.push(Node::Object(list))
    }

    fn array(&mut self, o: &Map<String, Value>, path: &str) -> Result<NodeId, SchemaError> {
        let items = match o.get("items") {
            None => self.push(Node::Any)?,
            Some(s) => self.compile(s, &format!("{path}/items"))?,
        };
        let min = count(o, "minItems", 0, path)?;
        let max = count(o, "maxItems", u32::MAX, path)?;
        bounds(min, max, "minItems", path)?;
        self.push(Node::Array { items, min, max })
    }

    /// `integer` or `number`, with its bounds if it has any.
    fn number(&mut self, o: &Map<String, Value>, integer: bool, path: &str) -> Result<NodeId, SchemaError> {
        let invalid = |keyword: &str, problem: String| SchemaError::Invalid {
            path: path.into(),
            keyword: keyword.into(),
            problem,
        };
        let number = |k: &str| -> Result<Option<f64>, SchemaError> {
            match o.get(k) {
                None => Ok(None),
                Some(Value::Number(n)) => Ok(n.as_f64()),
                // Draft 4: `exclusiveMinimum: true` makes `minimum` exclusive.
                Some(Value::Bool(_)) if k.starts_with("exclusive") => Ok(None),
                Some(v) => Err(invalid(k, format!("must be a number, not {}", json_kind(v)))),
            }
        };
        let flag = |k: &str| o.get(k) == Some(&Value::Bool(true));
        // The tighter of an inclusive and an exclusive bound on each side.
        let pick = |incl: Option<f64>, excl: Option<f64>, low: bool| match (incl, excl) {
            (Some(a), Some(b)) if (low && b >= a) || (!low && b <= a) => Some((b, true)),
            (Some(a), _) => Some((a, false)),
            (None, Some(b)) => Some((b, true)),
            (None, None) => None,
        };
        let lo = pick(number("minimum")?, number("exclusiveMinimum")?, true)
            .map(|(x, e)| (x, e || flag("exclusiveMinimum")));
        let hi = pick(number("maximum")?, number("exclusiveMaximum")?, false)
            .map(|(x, e)| (x, e || flag("exclusiveMaximum")));
        if lo.is_none() && hi.is_none() {
            return self.push(Node::Number { integer, range: None });
        }
        let range = Range::new(integer, lo, hi).ok_or_else(|| {
            let show = |b: Option<(f64, bool)>, op: [&str; 2]| {
                b.map(|(x, e)| format!("{} {x}", op[usize::from(e)])).unwrap_or_default()
            };
            let what = if integer { "integer" } else { "number" };
            SchemaError::Shape {
                path: path.into(),
                problem: format!(
                    "no {what} fits the bounds ({}{}{}) that can be written here (integers, and numbers whose \
                     integer part's every fraction fits; at most {} digits before the point)",
                    show(lo, [">=", ">"]),
                    if lo.is_some() && hi.is_some() { ", " } else { "" },
                    show(hi, ["<=", "<"]),
                    MAX_BOUNDED.to_string().len()
                ),
            }
        })?;
        self.push(Node::Number { integer, range: Some(range) })
    }

    fn string(&mut self, o: &Map<String, Value>, path: &str) -> Result<NodeId, SchemaError> {
        let min = count(o, "minLength", 0, path)?;
        let max = count(o, "maxLength", u32::MAX, path)?;
        bounds(min, max, "minLength", path)?;
        self.push(Node::String { min, max })
    }

    /// The top level: numbers alone are refused, and dropped beside other alternatives.
    fn top_level(&mut self, root: NodeId) -> Result<NodeId, SchemaError> {
        let no_end = || SchemaError::Shape {
            path: String::new(),
            problem: "the top level cannot be a number: nothing would mark where it ends (put it in an object)".into(),
        };
        match &self.nodes[usize::from(root)] {
            // Anything at the top level: an object, as `json_object` asks for.
            Node::Any => self.push(Node::AnyObject),
            Node::Number { .. } => Err(no_end()),
            Node::Values(v) if v[0][0] == b'-' || v[0][0].is_ascii_digit() => Err(no_end()),
            Node::Union(alts) => {
                let alts: Vec<(Kind, NodeId)> = alts.iter().copied().filter(|(k, _)| *k != Kind::Number).collect();
                if alts.is_empty() { Err(no_end()) } else { self.push(Node::Union(alts)) }
            }
            _ => Ok(root),
        }
    }
}

/// A non-negative count keyword (`minItems`, `maxLength`, ...), `default` when absent.
fn count(o: &Map<String, Value>, keyword: &str, default: u32, path: &str) -> Result<u32, SchemaError> {
    match o.get(keyword) {
        None => Ok(default),
        Some(v) => {
            v.as_u64().filter(|&n| n <= u64::from(u32::MAX - 1)).map(|n| n as u32).ok_or_else(|| SchemaError::Invalid {
                path: path.into(),
                keyword: keyword.into(),
                problem: format!("must be a non-negative integer, not {v}"),
            })
        }
    }
}

fn bounds(min: u32, max: u32, keyword: &str, path: &str) -> Result<(), SchemaError> {
    if min > max {
        return Err(SchemaError::Invalid {
            path: path.into(),
            keyword: keyword.into(),
            problem: format!("{min} exceeds the maximum {max}"),
        });
    }
    Ok(())
}

/// A JSON pointer segment (RFC 6901): `~` and `/` escaped.
fn pointer_escape(name: &str) -> String {
    name.replace('~', "~0").replace('/', "~1")
}

/// What kind of JSON value `v` is, for messages ("a string", "an array", ...).
pub fn json_kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}
