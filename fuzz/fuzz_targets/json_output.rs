//! The JSON-output recognizer on arbitrary bytes, used as a constrained generator would use it: refused bytes are
//! dropped, accepted ones kept. serde_json is the judge: whatever was kept is the start of some JSON text (it parses,
//! or fails only by running out of input) wherever the machine is between characters, and once the machine says
//! the object is complete it parses as an object and the machine accepts nothing more.
#![no_main]

use infer::structured::JsonMachine;
use libfuzzer_sys::fuzz_target;
use serde::de::IgnoredAny;

/// Whether `bytes` can be carried on to a JSON text. The judge reads into `IgnoredAny`, which checks syntax alone:
/// `serde_json::Value` is not neutral, since with the `raw_value` feature (axum turns it on) an object whose first
/// key is `$serde_json::private::RawValue` is taken for an embedded raw value, so the valid
/// `{"$serde_json::private::RawValue":"A:"}` fails to parse as a `Value` (the CI smoke run of 1dc7e9d found that
/// and blamed the machine). `IgnoredAny` has its own blind spot: a number cut short (`-`, `1.`, `1e`, `1e+`) is an
/// invalid number to it, not the end of the input, so a second try appends a digit. That cannot make a non-prefix
/// pass: whatever extends a prefix of JSON text was one already.
fn is_prefix(bytes: &[u8]) -> bool {
    let ok_or_eof = |b: &[u8]| match serde_json::from_slice::<IgnoredAny>(b) {
        Ok(_) => true,
        Err(e) => e.is_eof(),
    };
    ok_or_eof(bytes) || ok_or_eof(&[bytes, b"0"].concat())
}

fuzz_target!(|data: &[u8]| {
    let mut m = JsonMachine::new();
    let mut kept = Vec::with_capacity(data.len());
    for &b in data {
        if !m.step(b) {
            continue;
        }
        kept.push(b);
        if m.is_complete() {
            break;
        }
        if m.in_plain_string() || !m.in_string() {
            assert!(is_prefix(&kept), "not the start of JSON: {:?}", String::from_utf8_lossy(&kept));
        }
    }
    if m.is_complete() {
        serde_json::from_slice::<IgnoredAny>(&kept)
            .unwrap_or_else(|e| panic!("{e}: {:?}", String::from_utf8_lossy(&kept)));
        assert_eq!(kept.iter().find(|b| !b.is_ascii_whitespace()), Some(&b'{'), "not an object");
        assert!((0..=255u8).all(|b| !m.can_take(b)), "a byte after the closed object");
    }
});
