//! Helpers shared by the integration tests: the binary, the real models, scratch directories.

use std::path::PathBuf;
use std::process::{Command, Output};

/// The `infer` binary built for this test run.
pub fn infer_bin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_infer"))
}

/// Runs `infer` with `args` and returns its output.
pub fn infer(args: &[&str]) -> Output {
    infer_bin().args(args).output().expect("spawn infer")
}

/// Lower-case hex sha256 of `bytes`.
pub fn sha256_hex(bytes: &[u8]) -> String {
    use sha2::{Digest, Sha256};
    Sha256::digest(bytes).iter().map(|b| format!("{b:02x}")).collect()
}

/// A real model from the registry, fetched on first use through `infer pull` (so `cargo test` works on a fresh
/// machine). Returns `None`, with a note, only when fetching is impossible here and `INFER_REQUIRE_MODELS` is
/// unset; CI sets it so that a missing model fails loudly instead of skipping.
pub fn real_model(name: &str) -> Option<PathBuf> {
    // The same cache and file name as `infer pull` uses (the registry is the one place that knows them).
    let registry = infer::registry::Registry::load().expect("the registry loads");
    let entry = registry.get(name).unwrap_or_else(|| panic!("unknown test model {name}"));
    let path = infer::registry::models_dir(&infer::registry::infer_home()).join(&entry.file);
    if path.exists() {
        return Some(path);
    }
    let out = infer(&["pull", name]);
    if out.status.success() && path.exists() {
        return Some(path);
    }
    let why = String::from_utf8_lossy(&out.stderr);
    if std::env::var_os("INFER_REQUIRE_MODELS").is_some() {
        panic!("model {name} is required but could not be fetched: {why}");
    }
    eprintln!("note: skipping, model {name} unavailable: {why}");
    None
}

/// A fresh temporary directory, removed when dropped.
pub fn tempdir() -> tempfile::TempDir {
    tempfile::tempdir().expect("tempdir")
}

/// Path to a file in the shared reference folder (`../shared/reference` beside the project).
pub fn reference(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../shared/reference").join(name)
}

/// Asserts a command failed cleanly: non-zero exit, no panic, a one-line message mentioning `needle`.
pub fn assert_clean_failure(out: &Output, needle: &str) {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "expected failure, got success; stderr: {stderr}");
    assert_ne!(out.status.code(), Some(101), "exit code 101 means a panic: {stderr}");
    assert!(!stderr.contains("panicked"), "panicked: {stderr}");
    // clap follows a flag error with a hint to `--help`; that hint is not a second error.
    let lines = stderr.lines().filter(|l| !l.trim().is_empty() && !l.starts_with("For more information")).count();
    assert!(lines == 1, "expected a one-line error, got:\n{stderr}");
    assert!(stderr.contains(needle), "error should mention {needle:?}: {stderr}");
}
