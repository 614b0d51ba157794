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

/// Whether a test must fail, rather than skip, when something it needs is missing: CI sets `INFER_REQUIRE_MODELS`
/// (and `CI=true`), so that a test that could not run is never counted as passed.
pub fn required() -> bool {
    std::env::var_os("INFER_REQUIRE_MODELS").is_some() || std::env::var("CI").is_ok_and(|v| v == "true")
}

/// For a test that cannot run because `what` is missing: fails under CI ([`required`]), else notes the skip.
pub fn missing(what: &str) {
    assert!(!required(), "{what} is required here (CI) but missing");
    eprintln!("note: skipping, {what} is missing");
}

/// Whether `python3` can import `module`; under CI its absence fails the test instead.
pub fn python_module(module: &str) -> bool {
    let probe = std::process::Command::new("python3").args(["-c", &format!("import {module}")]).output();
    if probe.is_ok_and(|o| o.status.success()) {
        return true;
    }
    missing(&format!("python3 with the `{module}` package (pip install {module})"));
    false
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
    missing(&format!("model {name} ({})", String::from_utf8_lossy(&out.stderr).trim()));
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

/// The text of a reference file, or `None` (after [`missing`]: a failure under CI) when it is not there.
pub fn reference_text(name: &str) -> Option<String> {
    let path = reference(name);
    match std::fs::read_to_string(&path) {
        Ok(text) => Some(text),
        Err(e) => {
            missing(&format!("{} ({e})", path.display()));
            None
        }
    }
}

/// Runs a Python script with gguf-py (the reference GGUF reader) and returns its stdout, or `None` (after
/// [`missing`]: a failure under CI) when python3 or gguf-py is not installed. The script must succeed.
pub fn gguf_py(script: &str, args: &[&std::ffi::OsStr]) -> Option<String> {
    let probe = Command::new("python3").args(["-c", "import gguf"]).output();
    match probe {
        Err(e) => {
            missing(&format!("python3 ({e})"));
            return None;
        }
        Ok(p) if !p.status.success() => {
            missing("gguf-py (pip install gguf)");
            return None;
        }
        Ok(_) => {}
    }
    let out = Command::new("python3").arg("-c").arg(script).args(args).output().expect("run python3");
    assert!(out.status.success(), "gguf-py script failed: {}", String::from_utf8_lossy(&out.stderr));
    Some(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Sends SIGINT to a child, as Ctrl-C in its terminal would.
pub fn interrupt(child: &std::process::Child) {
    let sent = Command::new("kill").args(["-INT", &child.id().to_string()]).status();
    assert!(sent.is_ok_and(|s| s.success()), "could not send SIGINT with kill(1)");
}

/// Asserts a command failed cleanly: non-zero exit, no panic, a one-line message mentioning `needle`.
pub fn assert_clean_failure(out: &Output, needle: &str) {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "expected failure, got success; stderr: {stderr}");
    assert_ne!(out.status.code(), Some(101), "exit code 101 means a panic: {stderr}");
    assert!(!stderr.contains("panicked"), "panicked: {stderr}");
    // clap follows a flag error with the usage and a hint to `--help`; those are not a second error.
    let hint = |l: &str| l.starts_with("For more information") || l.starts_with("Usage: ") || l.starts_with("  tip: ");
    let lines = stderr.lines().filter(|l| !l.trim().is_empty() && !hint(l)).count();
    assert!(lines == 1, "expected a one-line error, got:\n{stderr}");
    assert!(stderr.contains(needle), "error should mention {needle:?}: {stderr}");
}
