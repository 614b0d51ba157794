//! `models.toml` parsing (the user's registry file in $INFER_HOME): any text is a registry or an error naming the
//! file, line and column; no entry that passes may name a file outside the cache.
#![no_main]

use infer::registry::Registry;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    if let Ok(r) = Registry::from_toml(text, "fuzz.toml") {
        for e in r.entries() {
            assert!(!e.file.contains('/') && !e.file.contains('\\') && !e.file.starts_with('.'), "{}", e.file);
        }
        let _ = (r.default_entry(), r.known_names());
    }
});
