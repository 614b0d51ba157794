//! GBNF grammars from arbitrary bytes, and the grammar machine driven by more of them: compiling never panics and
//! refuses or accepts; on a compiled grammar, bytes are kept when the machine accepts them (as a constrained
//! generator keeps tokens); the state reached byte by byte is the one the kept text reaches in one feed from the
//! start (and again after the tables start over); and where the text is complete, no byte may follow.
//!
//! The input is the grammar's text, a NUL byte, then the bytes to drive the machine with (the first 300).
#![no_main]

use std::sync::Arc;

use infer::structured::{Grammar, GrammarMachine};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some(split) = data.iter().position(|&b| b == 0) else { return };
    let Ok(source) = std::str::from_utf8(&data[..split]) else { return };
    let Ok(grammar) = Grammar::parse(source) else { return };
    let mut m = GrammarMachine::new(Arc::new(grammar));
    let mut state = m.start();
    let mut kept = Vec::new();
    // At most 300 bytes: a step's work is bounded (MAX_STEP_ENTRIES), and 300 of the slowest steps fit well inside
    // the 1 s limit under AddressSanitizer; more bytes would only repeat them.
    for &b in data[split + 1..].iter().take(300) {
        if m.is_accepting(state) && !m.is_open(state) {
            assert!((0..=255u8).all(|x| m.step(state, x).is_none()), "a byte after the complete text");
            break;
        }
        if let Some(next) = m.step(state, b) {
            state = next;
            kept.push(b);
        }
    }
    let start = m.start();
    assert_eq!(m.feed(start, &kept), Some(state), "{:?}", String::from_utf8_lossy(&kept));
    let (accepting, open) = (m.is_accepting(state), m.is_open(state));
    let state = m.start_over(state);
    assert_eq!((m.is_accepting(state), m.is_open(state)), (accepting, open));
});
