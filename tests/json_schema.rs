//! JSON schema output (`--json-schema`, `response_format: json_schema`): the compiler's refusals, the machine on
//! hand-made texts, random walks that must always be able to finish and whose finished texts a validator written
//! here (over serde_json values, not the machine's tables) accepts, the token mask against a token-by-token check,
//! and generation through the session, `serve` and `run`.

use std::sync::Arc;

use infer::kernels::GgmlType;
use infer::model::KvDtype;
use infer::session::{FinishReason, Session};
use infer::structured::{JsonSchema, OutputFormat, SchemaMachine, SortedVocab, vocab::allows};
use infer::tokenizer::Tokenizer;
use serde_json::{Value, json};

use crate::common::{infer, real_model};
use crate::engine::load;
use crate::structured::hot_request;
use crate::synthetic::{Rng, Spec};

fn compile(v: &Value) -> JsonSchema {
    JsonSchema::compile(v).unwrap_or_else(|e| panic!("{e}: {v}"))
}

fn completes(schema: &JsonSchema, text: &str) -> bool {
    let mut m = SchemaMachine::new(schema);
    m.feed(schema, text.as_bytes()) && m.is_complete()
}

/// Whether `v` is an instance of `schema` (whose `$ref`s point into `root`), for the keywords the compiler takes.
pub fn valid(schema: &Value, root: &Value, v: &Value) -> bool {
    let o = match schema {
        Value::Bool(b) => return *b,
        Value::Object(o) => o,
        _ => panic!("not a schema: {schema}"),
    };
    if o.get("nullable") == Some(&Value::Bool(true)) && v.is_null() {
        return true;
    }
    if let Some(r) = o.get("$ref") {
        return valid(root.pointer(&r.as_str().unwrap()[1..]).unwrap(), root, v);
    }
    for k in ["anyOf", "oneOf"] {
        if let Some(alts) = o.get(k) {
            return alts.as_array().unwrap().iter().any(|s| valid(s, root, v));
        }
    }
    if let Some(all) = o.get("allOf") {
        return all.as_array().unwrap().iter().all(|s| valid(s, root, v));
    }
    if let Some(e) = o.get("enum")
        && !e.as_array().unwrap().contains(v)
    {
        return false;
    }
    if o.get("const").is_some_and(|c| c != v) {
        return false;
    }
    if let Some(t) = o.get("type") {
        let types: Vec<&str> = match t {
            Value::String(s) => vec![s],
            _ => t.as_array().unwrap().iter().map(|x| x.as_str().unwrap()).collect(),
        };
        let fits = |name: &str| match name {
            "object" => v.is_object(),
            "array" => v.is_array(),
            "string" => v.is_string(),
            "number" => v.is_number(),
            "integer" => v.is_i64() || v.is_u64() || v.as_f64().is_some_and(|f| f.fract() == 0.0),
            "boolean" => v.is_boolean(),
            "null" => v.is_null(),
            _ => panic!("type {name}"),
        };
        if !types.iter().any(|t| fits(t)) {
            return false;
        }
    }
    let count = |k: &str| o.get(k).and_then(Value::as_u64).map(|n| n as usize);
    match v {
        Value::String(s) => {
            let n = s.chars().count();
            count("minLength").is_none_or(|m| n >= m) && count("maxLength").is_none_or(|m| n <= m)
        }
        Value::Array(items) => {
            count("minItems").is_none_or(|m| items.len() >= m)
                && count("maxItems").is_none_or(|m| items.len() <= m)
                && o.get("items").is_none_or(|s| items.iter().all(|x| valid(s, root, x)))
        }
        Value::Object(map) => {
            let props = o.get("properties").and_then(Value::as_object);
            let required = o.get("required").and_then(Value::as_array).cloned().unwrap_or_default();
            required.iter().all(|r| map.contains_key(r.as_str().unwrap()))
                && map.iter().all(|(k, x)| match props.and_then(|p| p.get(k)) {
                    Some(s) => valid(s, root, x),
                    None => match o.get("additionalProperties") {
                        Some(Value::Bool(false)) => false,
                        Some(s @ Value::Object(_)) => valid(s, root, x),
                        _ => true,
                    },
                })
        }
        Value::Number(n) => {
            let x = n.as_f64().unwrap();
            let bound = |k: &str| o.get(k).and_then(Value::as_f64);
            // Draft 4's boolean `exclusiveMinimum`/`exclusiveMaximum` make `minimum`/`maximum` exclusive.
            let flag = |k: &str| o.get(k) == Some(&Value::Bool(true));
            bound("minimum").is_none_or(|m| if flag("exclusiveMinimum") { x > m } else { x >= m })
                && bound("maximum").is_none_or(|m| if flag("exclusiveMaximum") { x < m } else { x <= m })
                && bound("exclusiveMinimum").is_none_or(|m| x > m)
                && bound("exclusiveMaximum").is_none_or(|m| x < m)
        }
        _ => true,
    }
}

/// Schemas that use every supported keyword between them.
fn schemas() -> Vec<Value> {
    vec![
        json!({
            "type": "object",
            "properties": {
                "name": {"type": "string", "minLength": 1, "maxLength": 12},
                "age": {"type": "integer"},
                "languages": {"type": "array", "items": {"enum": ["English", "French", "Rust"]}, "maxItems": 3},
                "retired": {"type": "boolean"},
                "height": {"type": "number", "description": "metres"},
            },
            "required": ["name", "age", "languages"],
        }),
        json!({
            "$defs": {
                "Node": {
                    "type": "object",
                    "properties": {
                        "label": {"const": "n"},
                        "children": {"type": "array", "items": {"$ref": "#/$defs/Node"}, "maxItems": 2},
                    },
                    "required": ["label"],
                },
                "Point": {"type": "object", "properties": {"x": {"type": "number"}, "y": {"type": "number"}},
                          "required": ["x", "y"], "additionalProperties": false},
            },
            "type": "object",
            "properties": {
                "tree": {"$ref": "#/$defs/Node"},
                "at": {"anyOf": [{"$ref": "#/$defs/Point"}, {"type": "null"}]},
                "tag": {"type": "string", "nullable": true},
                "level": {"allOf": [{"enum": [1, 2, 10, -3, 2.5]}]},
            },
            "required": ["tree", "at"],
        }),
        json!({
            "type": "object",
            "properties": {
                "counts": {"type": "object", "additionalProperties": {"type": "integer"}},
                "mixed": {"type": ["string", "integer", "null"], "minLength": 2},
                "pair": {"type": "array", "items": {"type": "string", "maxLength": 1}, "minItems": 2, "maxItems": 2},
                "free": {"type": "object"},
                "anything": {},
                "list": {"type": "array"},
                "empty": {"type": "object", "properties": {}, "additionalProperties": false},
                "title": {"type": "string", "maxLength": 20},
            },
            "required": ["counts", "mixed", "pair", "free", "anything", "list", "empty"],
        }),
        json!({"type": "array", "items": {"enum": ["a", "ab", "b", true, null, {"k": [1]}]}, "minItems": 1}),
        json!({"enum": ["red", "green", "blue", "reddish"]}),
        json!({"type": ["integer", "string"], "maxLength": 3}),
        variants(),
        bounded(),
    ]
}

/// Numbers and integers between bounds, inclusive and exclusive (and draft 4's boolean form), on both sides of
/// zero, with bounds that are not integers, and one that only a prefix of ten digits can reach.
fn bounded() -> Value {
    json!({
        "type": "object",
        "properties": {
            "count": {"type": "integer", "minimum": 1, "maximum": 100},
            "temperature": {"type": "number", "minimum": 0, "maximum": 2},
            "offset": {"type": "integer", "exclusiveMinimum": -10.5, "exclusiveMaximum": 10},
            "ratio": {"type": "number", "exclusiveMinimum": -1.5, "maximum": 0.5},
            "year": {"type": "integer", "minimum": 1900, "maximum": 2100},
            "big": {"type": "integer", "minimum": 1234567890},
            "old": {"type": "number", "minimum": 0, "exclusiveMinimum": true, "maximum": 3},
            "either": {"type": ["integer", "null"], "maximum": -3},
        },
        "required": ["count", "temperature", "offset", "ratio", "year", "big", "old", "either"],
    })
}

/// Object alternatives told apart by their first property: by name (`response`, `level`, `level2`), by a string
/// tag of `name` (tool calls: `get` and `get_w` of one alternative beside `get_time` and `get_weather`, every one a
/// prefix of another without its quote), and by a number tag of `v` (`1` a prefix of `10`), beside a string.
fn variants() -> Value {
    let call = |name: Value, args: Value| json!({"type": "object", "properties": {"name": name, "arguments": args}, "required": ["name", "arguments"]});
    json!({
        "type": "array", "minItems": 1, "maxItems": 3,
        "items": {"anyOf": [
            call(json!({"const": "get_weather"}),
                 json!({"type": "object", "properties": {"city": {"type": "string", "maxLength": 8}}, "required": ["city"]})),
            call(json!({"const": "get_time"}), json!({"type": "object", "properties": {}, "additionalProperties": false})),
            {"type": "object", "properties": {"name": {"enum": ["get", "get_w"]}, "n": {"type": "integer"}}, "required": ["name"]},
            {"anyOf": [
                {"type": "object", "properties": {"response": {"type": "string"}}, "required": ["response"]},
                {"type": "object", "properties": {"level": {"enum": [1, 10]}, "x": {"type": "boolean"}}},
            ]},
            {"type": "object", "properties": {"level2": {"type": "null"}}, "required": ["level2"]},
            {"type": "object", "properties": {"v": {"enum": [1, 10]}, "w": {"type": "integer"}}, "required": ["v", "w"]},
            {"type": "object", "properties": {"v": {"const": 2}}, "required": ["v"]},
            {"type": "string", "maxLength": 3},
        ]},
    })
}

#[test]
fn refused_schemas_name_the_keyword_and_place() {
    for (schema, needle) in [
        (json!({"type": "string", "pattern": "a+"}), "at '': keyword `pattern` is not supported"),
        (
            json!({"properties": {"a": {"type": "integer", "multipleOf": 2}}}),
            "at '/properties/a': keyword `multipleOf`",
        ),
        (
            json!({"properties": {"a": {"type": "number", "minimum": 0.2, "maximum": 0.8}}}),
            "at '/properties/a': no number fits the bounds (>= 0.2, <= 0.8) that can be written here",
        ),
        (json!({"properties": {"a": {"type": "integer", "exclusiveMinimum": 1, "maximum": 1}}}), "no integer fits"),
        (json!({"properties": {"a": {"type": "integer", "minimum": "1"}}}), "`minimum` must be a number, not a string"),
        (json!({"type": "integer"}), "the top level cannot be a number"),
        (json!({"enum": [1, 2]}), "the top level cannot be a number"),
        (json!({"type": "strin"}), "`type` names an unknown type \"strin\""),
        (json!({"type": 3}), "`type` must be a string or an array, not a number"),
        (
            json!({"anyOf": [{"type": "object"}, {"type": "object", "properties": {"a": true}}]}),
            "an object alternative without declared properties beside other object alternatives",
        ),
        (
            json!({"anyOf": [{"type": "object", "properties": {"a": {"type": "string"}}},
                             {"type": "object", "properties": {"a": {"const": 1}}}]}),
            "at '': 2 object alternatives begin with the property \"a\", and not all of them fix its value",
        ),
        (
            json!({"anyOf": [{"type": "object", "properties": {"t": {"const": "a"}}},
                             {"type": "object", "properties": {"t": {"enum": ["b", "a"]}}}]}),
            "two object alternatives both begin with \"t\": \"a\"",
        ),
        (
            json!({"anyOf": [{"type": "object", "properties": {"t": {"const": "a"}}},
                             {"type": "object", "properties": {"t": {"const": 1}}}]}),
            "values of \"t\" are of different kinds",
        ),
        (json!({"type": ["integer", "number"]}), "both allow a number"),
        (json!({"$ref": "#/$defs/Missing"}), "does not point into this schema"),
        (json!({"$ref": "http://example.com/s.json"}), "does not point into this schema"),
        (json!({"$defs": {"A": {"$ref": "#/$defs/A"}}, "$ref": "#/$defs/A"}), "refers only to itself"),
        (json!({"type": "object", "required": ["a"]}), "names \"a\", which `properties` does not declare"),
        (json!({"type": "array", "minItems": 3, "maxItems": 2}), "`minItems` 3 exceeds the maximum 2"),
        (json!({"type": "string", "maxLength": -1}), "`maxLength` must be a non-negative integer"),
        (json!({"enum": []}), "`enum` lists no values"),
        (json!({"allOf": [{"type": "object"}, {"required": []}]}), "`allOf` with 2 schemas"),
        (json!({"enum": ["a"], "minLength": 1}), "`enum` with `minLength` beside it"),
        (json!(false), "`false` allows no value"),
        (
            json!({"$defs": {"A": {"type": "object", "properties": {"a": {"$ref": "#/$defs/A"}}, "required": ["a"]}},
                   "$ref": "#/$defs/A"}),
            "no finite value fits it",
        ),
        (nested(17), "its smallest value nests 17 objects and arrays deep; at most 16"),
        (ref_chain(5000), "subschemas nest more than 128 deep"),
        (json!("object"), "a schema is an object or a boolean, not a string"),
    ] {
        let e = JsonSchema::compile(&schema).expect_err(&schema.to_string()).to_string();
        assert!(e.contains(needle), "{schema}: {e}");
    }
}

/// A chain of `n` definitions, each only a reference to the next, the last a string.
fn ref_chain(n: usize) -> Value {
    let mut defs = serde_json::Map::new();
    for i in 0..n {
        defs.insert(format!("d{i}"), json!({"$ref": format!("#/$defs/d{}", i + 1)}));
    }
    defs.insert(format!("d{n}"), json!({"type": "string"}));
    json!({"$defs": defs, "$ref": "#/$defs/d0"})
}

/// `levels` objects, each the required property `a` of the one around it (the innermost one empty).
fn nested(levels: usize) -> Value {
    let empty = json!({"type": "object", "properties": {}, "additionalProperties": false});
    (1..levels).fold(empty, |inner, _| json!({"type": "object", "properties": {"a": inner}, "required": ["a"]}))
}

/// Deep enough to fill the machine's frames: what could not be finished is never opened, so no text reaches a
/// point where nothing may follow.
#[test]
fn nesting_stops_where_a_value_could_no_longer_be_finished() {
    let s = compile(&nested(16));
    let text = format!("{}{}", "{\"a\":".repeat(15), "{}") + &"}".repeat(15);
    assert!(completes(&s, &text));
    // A tree: each level is an object and its array of children, two frames.
    let tree = compile(&schemas()[1]);
    let mut m = SchemaMachine::new(&tree);
    assert!(m.feed(&tree, br#"{"tree":"#));
    let mut levels = 0;
    while m.clone().feed(&tree, br#"{"label":"n","children":["#) {
        assert!(m.feed(&tree, br#"{"label":"n","children":["#));
        levels += 1;
    }
    // The outer object and 7 levels of two take 15 frames: one more node fits, without its array of children.
    assert_eq!(levels, 7);
    assert!(m.feed(&tree, br#"{"label":"n""#));
    assert!(!m.clone().step(&tree, b','), "no key whose value fits is left");
    assert!(m.feed(&tree, b"}"));
    assert!(m.feed(&tree, "]}".repeat(levels).as_bytes()) && m.feed(&tree, br#","at":null}"#), "{m:?}");
    assert!(m.is_complete());
}

#[test]
fn the_machine_takes_what_the_schema_allows_and_nothing_else() {
    let s = compile(&schemas()[0]);
    for text in [
        r#"{"name":"Ada","age":36,"languages":[]}"#,
        r#"{"name": "Ada", "age": -1, "languages": ["French", "Rust"], "height": 1.5e0}"#,
        "{\n  \"name\": \"\\u00e9\",\n  \"age\": 0,\n  \"languages\": [\"English\"],\n  \"retired\": false\n}",
    ] {
        assert!(completes(&s, text), "{text}");
    }
    for text in [
        r#"{"age":36,"name":"Ada","languages":[]}"#,
        r#"{"name":"Ada","age":36}"#,
        r#"{"name":"","age":36,"languages":[]}"#,
        r#"{"name":"Ada Lovelace Byron","age":36,"languages":[]}"#,
        r#"{"name":"Ada","age":36.5,"languages":[]}"#,
        r#"{"name":"Ada","age":36,"languages":["German"]}"#,
        r#"{"name":"Ada","age":36,"languages":["Rust","Rust","Rust","Rust"]}"#,
        r#"{"name":"Ada","age":36,"languages":[],"extra":1}"#,
        r#"{"name":"Ada","age":36,"languages":[],"retired":"no"}"#,
        r#" {"name":"Ada","age":36,"languages":[]}"#,
    ] {
        assert!(!completes(&s, text), "{text}");
    }
    let s = compile(&schemas()[4]);
    assert!(completes(&s, r#""red""#) && completes(&s, r#""reddish""#) && !completes(&s, r#""re""#));
    let s = compile(&schemas()[1]);
    assert!(completes(&s, r#"{"tree":{"label":"n","children":[{"label":"n"}]},"at":null,"level":10}"#));
    assert!(completes(&s, r#"{"tree":{"label":"n"},"at":{"x":1,"y":2},"tag":null}"#));
    assert!(!completes(&s, r#"{"tree":{"label":"n"},"at":null,"level":3}"#));
    assert!(!completes(&s, r#"{"tree":{"label":"m"},"at":null}"#));

    let s = compile(&bounded());
    let doc = |count: &str, temperature: &str, offset: &str, ratio: &str, year: &str, big: &str, old: &str| {
        format!(
            r#"{{"count":{count},"temperature":{temperature},"offset":{offset},"ratio":{ratio},"year":{year},"big":{big},"old":{old},"either":null}}"#
        )
    };
    let fine = doc("1", "0", "-10", "-0.4", "1900", "1234567890", "1.5");
    assert!(completes(&s, &fine), "{fine}");
    for text in [
        doc("100", "1.999", "9", "0", "2100", "99999999999", "3"),
        doc("42", "2", "0", "-0", "2026", "1234567891", "1"),
        doc("7", "0.0", "-0", "-0.25", "1999", "2000000000", "2.75"),
    ] {
        assert!(completes(&s, &text), "{text}");
    }
    for text in [
        doc("0", "0", "0", "0", "1900", "1234567890", "1"),
        doc("101", "0", "0", "0", "1900", "1234567890", "1"),
        doc("1", "2.5", "0", "0", "1900", "1234567890", "1"),
        doc("1", "-0.5", "0", "0", "1900", "1234567890", "1"),
        doc("1", "1e0", "0", "0", "1900", "1234567890", "1"),
        doc("1", "0", "10", "0", "1900", "1234567890", "1"),
        doc("1", "0", "-11", "0", "1900", "1234567890", "1"),
        doc("1", "0", "1.0", "0", "1900", "1234567890", "1"),
        doc("1", "0", "0", "0.6", "1900", "1234567890", "1"),
        doc("1", "0", "0", "0", "1899", "1234567890", "1"),
        doc("1", "0", "0", "0", "210", "1234567890", "1"),
        doc("1", "0", "0", "0", "1900", "123456789", "1"),
        doc("1", "0", "0", "0", "1900", "1234567890", "0"),
        // Within the bounds, but outside what is generated: not every -1.x exceeds -1.5, not every 0.x exceeds 0.
        doc("1", "0", "0", "-1.4", "1900", "1234567890", "1"),
        doc("1", "0", "0", "0", "1900", "1234567890", "0.5"),
        doc("01", "0", "0", "0", "1900", "1234567890", "1"),
    ] {
        assert!(!completes(&s, &text), "{text}");
    }
    // Only the subset whose integer part's every fraction fits: 0.75 is in bounds, but not every 0.x is.
    let s2 = compile(
        &json!({"type": "object", "properties": {"x": {"type": "number", "minimum": 0.5, "maximum": 2.5}}, "required": ["x"]}),
    );
    assert!(completes(&s2, r#"{"x":1.75}"#) && completes(&s2, r#"{"x":2}"#));
    assert!(!completes(&s2, r#"{"x":0.75}"#) && !completes(&s2, r#"{"x":2.25}"#));

    let s = compile(&variants());
    for text in [
        r#"[{"name":"get_time","arguments":{}}]"#,
        r#"[{"name": "get_weather", "arguments": {"city": "Oslo"}}, "abc"]"#,
        r#"[{"name":"get","n":3},{"name":"get_w"}]"#,
        r#"[{"response":"hi"},{"level":10,"x":true},{"level2":null}]"#,
        r#"[{"v":10,"w":1},{"v":2},{"v":1,"w":-4}]"#,
    ] {
        assert!(completes(&s, text), "{text}");
    }
    for text in [
        r#"[{"name":"get_time","arguments":{"city":"x"}}]"#,
        r#"[{"name":"get_weather","arguments":{}}]"#,
        r#"[{"name":"get_w","arguments":{}}]"#,
        r#"[{"name":"ge"}]"#,
        r#"[{"arguments":{},"name":"get_time"}]"#,
        r#"[{}]"#,
        r#"[{"x":true}]"#,
        r#"[{"v":3}]"#,
        r#"[{"v":1}]"#,
        r#"[{"v":2,"w":1}]"#,
        r#"[{"level":2}]"#,
    ] {
        assert!(!completes(&s, text), "{text}");
    }
}

/// One random walk over the bytes the machine accepts, up to `limit` bytes, taking one of `closers` with
/// probability `close` where it can (so that walks end); fails at a point where no byte can follow.
fn walk_bytes(
    s: &JsonSchema,
    source: &Value,
    rng: &mut Rng,
    closers: &[u8],
    close: f32,
    limit: usize,
) -> (SchemaMachine, Vec<u8>) {
    let mut m = SchemaMachine::new(s);
    let mut text = Vec::new();
    while !m.is_complete() && text.len() < limit {
        let next: Vec<u8> = (0..=255u8).filter(|&b| m.clone().step(s, b)).collect();
        assert!(!next.is_empty(), "{source}: dead end after {:?}", String::from_utf8_lossy(&text));
        let ends: Vec<u8> = next.iter().copied().filter(|b| closers.contains(b)).collect();
        let pick = if !ends.is_empty() && rng.uniform() < close { &ends } else { &next };
        let b = pick[(rng.next_u64() % pick.len() as u64) as usize];
        assert!(m.step(s, b));
        text.push(b);
    }
    (m, text)
}

/// Random walks over the bytes the machine accepts: it never leaves the walk without a next byte before the value
/// is complete, and every complete text parses and is an instance of the schema.
#[test]
fn random_walks_always_finish_into_instances() {
    let mut rng = Rng::new(7);
    for source in schemas() {
        let s = compile(&source);
        let mut finished = 0;
        for walk in 0..300 {
            let (m, text) = walk_bytes(&s, &source, &mut rng, b"\"}],", 0.4, 3000);
            if m.is_complete() {
                finished += 1;
                let v: Value = serde_json::from_slice(&text)
                    .unwrap_or_else(|e| panic!("walk {walk}: {e}: {}", String::from_utf8_lossy(&text)));
                assert!(valid(&source, &source, &v), "{source}: {v}");
            }
        }
        assert!(finished >= 200, "{source}: only {finished} of 300 walks finished");
    }
}

/// Random bounds (integer and fractional, inclusive, exclusive, one-sided, around zero, far out): every walk through
/// a bounded number can be finished, and finishes within its bounds.
#[test]
fn bounded_numbers_never_reach_a_dead_end() {
    let mut rng = Rng::new(11);
    let pick = |rng: &mut Rng| -> Option<Value> {
        let x = match rng.next_u64() % 6 {
            0 => return None,
            1 => (rng.next_u64() % 21) as f64 - 10.0,
            2 => ((rng.next_u64() % 41) as f64 - 20.0) / 4.0,
            3 => (rng.next_u64() % 2_000_000) as f64 - 1_000_000.0,
            4 => ((rng.next_u64() % 2001) as f64 - 1000.0) / 1000.0,
            _ => 1e20 * if rng.next_u64().is_multiple_of(2) { 1.0 } else { -1.0 },
        };
        Some(json!(x))
    };
    let (mut schemas, mut refused) = (0, 0);
    for _ in 0..400 {
        let mut x = serde_json::Map::new();
        x.insert("type".into(), json!(if rng.next_u64().is_multiple_of(2) { "integer" } else { "number" }));
        for k in ["minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"] {
            if let Some(v) = pick(&mut rng).filter(|_| rng.next_u64().is_multiple_of(3)) {
                x.insert(k.into(), v);
            }
        }
        let source = json!({"type": "array", "items": Value::Object(x), "minItems": 1, "maxItems": 3});
        let s = match JsonSchema::compile(&source) {
            Ok(s) => s,
            Err(e) => {
                assert!(e.to_string().contains("fits the bounds"), "{source}: {e}");
                refused += 1;
                continue;
            }
        };
        schemas += 1;
        for _ in 0..20 {
            let (m, text) = walk_bytes(&s, &source, &mut rng, b"],", 0.3, 500);
            assert!(m.is_complete(), "{source}: {}", String::from_utf8_lossy(&text));
            let v: Value = serde_json::from_slice(&text).unwrap();
            assert!(valid(&source, &source, &v), "{source}: {v}");
        }
    }
    eprintln!("{schemas} bounded schemas walked, {refused} refused as empty");
    assert!(schemas > 250, "{schemas}");
}

/// States met while reading instances of the schemas byte by byte.
fn sample_states() -> Vec<(Arc<JsonSchema>, SchemaMachine)> {
    let docs = [
        (0, "{\"name\": \"Ad\\u00e9\", \"age\": -12, \"languages\": [\"French\", \"Rust\"], \"retired\": true}"),
        (1, r#"{"tree":{"label":"n","children":[{"label":"n"}]},"at":{"x":1.5,"y":-2e3},"tag":"é 😀","level":2.5}"#),
        (
            2,
            r#"{"counts":{"a b":1},"mixed":"xy","pair":["a","b"],"free":{"k":[1,"s"]},"anything":"t","list":[],"empty":{},"title":"a b"}"#,
        ),
        (3, r#"["ab",{"k":[1]},null]"#),
        (6, r#"[{"name":"get_weather","arguments":{"city":"Oslo"}}, {"v":10,"w":1},{"level":1}]"#),
        (
            7,
            r#"{"count":17,"temperature":1.25,"offset":-7,"ratio":-0.5,"year":1987,"big":31415926535,"old":2.5,"either":-4}"#,
        ),
    ];
    let all = schemas();
    let mut out = Vec::new();
    for (i, doc) in docs {
        let s = Arc::new(compile(&all[i]));
        let mut m = SchemaMachine::new(&s);
        out.push((s.clone(), m));
        for &b in doc.as_bytes() {
            assert!(m.step(&s, b), "{doc}");
            out.push((s.clone(), m));
        }
        assert!(m.is_complete(), "{doc}");
    }
    out
}

fn check_masks(tok: &Tokenizer) {
    let vocab = SortedVocab::new(tok);
    let (mut mask, mut scratch) = (Vec::new(), Vec::new());
    for (s, state) in sample_states() {
        vocab.fill_mask(&state, state.plain_string(&s), |m, b| m.step(&s, b), &mut mask, &mut scratch);
        for id in 0..tok.n_vocab() as u32 {
            let bytes = tok.token_bytes(id, true);
            let mut m = state;
            let expected = !bytes.is_empty() && !tok.is_eog(id) && m.feed(&s, bytes);
            assert_eq!(allows(&mask, id), expected, "token {id} {:?} in {state:?}", String::from_utf8_lossy(bytes));
        }
        assert!(mask.iter().any(|&w| w != 0) || state.is_complete(), "nothing allowed in {state:?}");
    }
}

#[test]
fn the_mask_matches_a_token_by_token_check_on_a_synthetic_vocabulary() {
    let (_, tok) = load(Spec::llama(GgmlType::Q8_0));
    check_masks(&tok);
}

#[test]
fn the_mask_matches_a_token_by_token_check_on_smollm2() {
    let Some(path) = real_model("smollm2") else { return };
    let file = infer::gguf::GgufFile::open(&path).unwrap();
    check_masks(&Tokenizer::from_gguf(&file).unwrap());
}

/// The session at a high temperature on a random model: whatever ended on its own is an instance.
#[test]
fn session_output_is_an_instance_on_a_random_model() {
    let (model, tok) = load(Spec::llama(GgmlType::Q8_0));
    let mut session = Session::new(&model, &tok, 512, KvDtype::F16);
    let cancel = std::sync::atomic::AtomicBool::new(false);
    for source in [&schemas()[0], &schemas()[3], &schemas()[4]] {
        let format = OutputFormat::JsonSchema(Arc::new(compile(source)));
        let mut closed = 0;
        for seed in 0..8 {
            let req = hot_request(format.clone(), seed, 200);
            let g = session.generate(&req, &cancel, &mut |_| Ok(())).unwrap();
            if g.finish == FinishReason::Stop {
                let v: Value = serde_json::from_str(&g.text).unwrap_or_else(|e| panic!("{e}: {:?}", g.text));
                assert!(valid(source, source, &v), "{source}: {v}");
                closed += 1;
            }
        }
        assert!(closed >= 2, "{source}: only {closed} of 8 replies closed within 200 tokens");
    }
}

#[test]
fn serve_takes_json_schema_in_openai_and_llama_server_forms() {
    use crate::serve::{Server, post, tiny_model};
    let dir = crate::common::tempdir();
    let server = Server::start(&tiny_model(dir.path()), &["--ctx-size", "512", "--chat-template", "chatml"]);
    let schema = json!({"type": "object", "properties": {"colour": {"enum": ["red", "green"]},
                        "n": {"type": "array", "items": {"type": "boolean"}, "minItems": 1, "maxItems": 3}},
                        "required": ["colour", "n"]});
    let sampling = json!({"max_tokens": 200, "temperature": 1.2, "top_k": 0, "top_p": 1.0, "min_p": 0.0});
    let forms = [
        (
            "response_format",
            json!({"type": "json_schema", "json_schema": {"name": "c", "schema": schema, "strict": true}}),
        ),
        ("response_format", json!({"type": "json_object", "schema": schema})),
        ("json_schema", schema.clone()),
    ];
    let mut closed = 0;
    for (seed, (field, value)) in forms.iter().enumerate() {
        for round in 0..3 {
            let mut body = json!({"messages": [{"role": "user", "content": "a colour"}], "seed": seed * 10 + round});
            body[*field] = value.clone();
            for (k, v) in sampling.as_object().unwrap() {
                body[k] = v.clone();
            }
            let (status, _, text) = post(&format!("{}/v1/chat/completions", server.base), body.to_string().as_bytes());
            assert_eq!(status, 200, "{text}");
            let v: Value = serde_json::from_str(&text).unwrap();
            let content = v["choices"][0]["message"]["content"].as_str().unwrap();
            let first_key = content.strip_prefix('{').map(str::trim_start);
            assert!(first_key.is_some_and(|k| k.starts_with("\"colour\"")), "{content:?}");
            if v["choices"][0]["finish_reason"] == "stop" {
                let out: Value = serde_json::from_str(content).unwrap_or_else(|e| panic!("{e}: {content:?}"));
                assert!(valid(&schema, &schema, &out), "{out}");
                closed += 1;
            }
        }
    }
    assert!(closed >= 3, "only {closed} of 9 replies closed");
    for (body, param, needle) in [
        (
            json!({"prompt": "hi", "response_format": {"type": "json_schema", "json_schema": {"schema": {"type": "string", "format": "email", "pattern": "@"}}}}),
            "response_format",
            "`response_format.json_schema.schema`: JSON schema at '': keyword `pattern` is not supported",
        ),
        (
            json!({"prompt": "hi", "response_format": {"type": "json_schema"}}),
            "response_format",
            "needs a `json_schema` object",
        ),
        (
            json!({"prompt": "hi", "response_format": {"type": "json_schema", "json_schema": "x"}}),
            "response_format",
            "must be an object",
        ),
        (json!({"prompt": "hi", "json_schema": {"type": "number"}}), "json_schema", "the top level cannot be a number"),
        (
            json!({"prompt": "hi", "json_schema": {}, "response_format": {"type": "text"}}),
            "response_format",
            "not both",
        ),
        (
            json!({"prompt": "hi", "response_format": {"type": "yaml"}}),
            "response_format",
            "expected \"text\", \"json_object\" or \"json_schema\"",
        ),
    ] {
        let (status, _, text) = post(&format!("{}/v1/completions", server.base), body.to_string().as_bytes());
        assert_eq!(status, 400, "{body} -> {text}");
        let v: Value = serde_json::from_str(&text).unwrap();
        assert_eq!(v["error"]["param"], param, "{text}");
        assert!(v["error"]["message"].as_str().unwrap().contains(needle), "{body}: {text}");
    }
}

#[test]
fn run_json_schema_on_smollm2_gives_instances() {
    let Some(path) = real_model("smollm2") else { return };
    let path = path.to_str().unwrap();
    let source = schemas()[0].clone();
    let dir = crate::common::tempdir();
    let file = dir.path().join("person.json");
    std::fs::write(&file, source.to_string()).unwrap();
    let prompt = "Describe Ada Lovelace as a JSON object with her name, age and the languages she knew.";
    let mut closed = 0;
    for seed in ["1", "2", "3"] {
        let out = infer(&[
            "run",
            path,
            "--chat",
            "-p",
            prompt,
            "--json-schema-file",
            file.to_str().unwrap(),
            "-n",
            "200",
            "--seed",
            seed,
            "--json",
            "-t",
            "2",
        ]);
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let v: Value = serde_json::from_slice(&out.stdout).unwrap();
        if v["finish_reason"] == "stop" {
            let text = v["text"].as_str().unwrap();
            let inst: Value = serde_json::from_str(text).unwrap_or_else(|e| panic!("{e}: {text:?}"));
            assert!(valid(&source, &source, &inst), "{inst}");
            closed += 1;
        }
    }
    assert!(closed >= 2, "only {closed} of 3 replies closed within 200 tokens");
    // Greedy, with the schema inline: the object alone on stdout, in the schema's property order.
    let out = infer(&["run", path, "--chat", "-p", prompt, "-j", &source.to_string(), "-n", "200", "--temp", "0"]);
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    let v: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text:?}"));
    assert_eq!(v.as_object().unwrap().keys().take(3).collect::<Vec<_>>(), ["name", "age", "languages"], "{text}");
    assert!(valid(&source, &source, &v), "{v}");
    // A schema it cannot hold the output to fails before the model loads, naming the keyword.
    let bad = infer(&["run", path, "-p", "hi", "-j", r#"{"type":"string","pattern":"x"}"#]);
    assert!(!bad.status.success());
    let err = String::from_utf8_lossy(&bad.stderr);
    assert!(err.contains("keyword `pattern` is not supported"), "{err}");
    let bad = infer(&["run", path, "-p", "hi", "--json-schema-file", "/nonexistent/schema.json"]);
    assert!(!bad.status.success());
    assert!(String::from_utf8_lossy(&bad.stderr).contains("/nonexistent/schema.json"));
    let bad = infer(&["run", path, "-p", "hi", "-j", "{not json"]);
    assert!(String::from_utf8_lossy(&bad.stderr).contains("not JSON"));
}

/// `/save` keeps a chat's schema with its settings and `/load` compiles it again; a schema it cannot use is an
/// error naming the keyword.
#[test]
fn chat_settings_save_and_load_a_schema() {
    use infer::chat::ChatSettings;
    let schema = Arc::new(compile(&schemas()[1]));
    let settings = ChatSettings { format: OutputFormat::JsonSchema(schema), ..ChatSettings::default() };
    let text = serde_json::to_string(&settings).unwrap();
    let back: ChatSettings = serde_json::from_str(&text).unwrap();
    assert_eq!(back, settings);
    assert_eq!(back.format.name(), "json-schema");
    let bad = text.replace("\"const\":\"n\"", "\"pattern\":\"n\"");
    let e = serde_json::from_str::<ChatSettings>(&bad).unwrap_err().to_string();
    assert!(e.contains("keyword `pattern` is not supported"), "{e}");
}
