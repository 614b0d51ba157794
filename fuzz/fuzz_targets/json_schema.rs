//! JSON schemas from arbitrary bytes, and the schema machine driven by more of them: compiling never panics and
//! refuses or accepts; on a compiled schema, bytes are kept when the machine accepts them (as a constrained
//! generator keeps tokens), and at every point before the value is complete some byte can follow (the machine
//! never walks into a dead end), and once it is complete the kept text parses as JSON and nothing may follow.
//!
//! The input is the schema's JSON text, a NUL byte, then the bytes to drive the machine with.
#![no_main]

use infer::structured::{JsonSchema, SchemaMachine};
use libfuzzer_sys::fuzz_target;
use serde::de::IgnoredAny;

fuzz_target!(|data: &[u8]| {
    let Some(split) = data.iter().position(|&b| b == 0) else { return };
    let Ok(source) = serde_json::from_slice::<serde_json::Value>(&data[..split]) else { return };
    let Ok(schema) = JsonSchema::compile(&source) else { return };
    let mut m = SchemaMachine::new(&schema);
    let mut kept = Vec::new();
    for &b in &data[split + 1..] {
        if m.is_complete() {
            break;
        }
        assert!((0..=255u8).any(|x| m.clone().step(&schema, x)), "dead end after {:?}", String::from_utf8_lossy(&kept));
        if m.step(&schema, b) {
            kept.push(b);
        }
    }
    if m.is_complete() {
        // IgnoredAny, not Value: see json_output.rs on serde_json's private raw-value key.
        serde_json::from_slice::<IgnoredAny>(&kept)
            .unwrap_or_else(|e| panic!("{e}: {:?}", String::from_utf8_lossy(&kept)));
        assert!((0..=255u8).all(|x| !m.clone().step(&schema, x)), "a byte after the complete value");
    }
});
