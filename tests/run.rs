//! `infer run`: a real answer, reproducible sampling, stop strings, JSON output, context limits, bad input.

use crate::common::{assert_clean_failure, infer, infer_bin, real_model, tempdir};
use crate::synthetic::{Spec, build};
use infer::kernels::GgmlType;

fn stdout(out: &std::process::Output) -> String {
    assert!(out.status.success(), "infer failed: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout.clone()).expect("stdout is UTF-8")
}

#[test]
fn smollm2_knows_the_capital_of_france() {
    let Some(path) = real_model("smollm2") else { return };
    let out =
        infer(&["run", path.to_str().unwrap(), "-p", "The capital of France is", "-n", "8", "--temp", "0", "-t", "2"]);
    let text = stdout(&out);
    assert!(text.starts_with(" Paris"), "got {text:?}");
}

#[test]
fn same_seed_same_text_and_stop_strings_cut() {
    let Some(path) = real_model("smollm2") else { return };
    let p = path.to_str().unwrap();
    let args = ["run", p, "-p", "Once upon a time", "-n", "24", "--seed", "1234", "-t", "2"];
    let a = stdout(&infer(&args));
    let b = stdout(&infer(&args));
    assert_eq!(a, b, "the same seed gives the same text");
    assert!(!a.is_empty());

    // Greedy text, then stop at a word in its middle: output ends right before it.
    let greedy = stdout(&infer(&["run", p, "-p", "The capital of France is", "-n", "24", "--temp", "0", "-t", "2"]));
    let words: Vec<&str> = greedy.split(' ').filter(|w| w.len() > 3).collect();
    let stop_word = words.get(2).or(words.last()).expect("some words");
    let cut = greedy.find(stop_word).unwrap();
    let stopped = stdout(&infer(&[
        "run",
        p,
        "-p",
        "The capital of France is",
        "-n",
        "24",
        "--temp",
        "0",
        "-t",
        "2",
        "--stop",
        stop_word,
    ]));
    assert_eq!(stopped, greedy[..cut], "stop string {stop_word:?} cuts the greedy text {greedy:?}");
}

#[test]
fn json_output_and_finish_reasons() {
    let Some(path) = real_model("smollm2") else { return };
    let p = path.to_str().unwrap();
    let out = stdout(&infer(&["run", p, "-p", "Hello", "-n", "5", "--temp", "0", "--json"]));
    let v: serde_json::Value = serde_json::from_str(out.trim()).expect("one JSON object");
    assert_eq!(v["finish_reason"], "length");
    assert_eq!(v["tokens"].as_array().unwrap().len(), 5);
    assert!(v["seed"].is_u64() && v["text"].is_string());
    for k in ["load_ms", "prompt_tokens_per_second", "generation_tokens_per_second"] {
        assert!(v["timings"][k].is_number(), "timings.{k}");
    }
    // A context of 8 tokens fills during generation: finish_reason length, and stderr says so.
    let out = infer(&["run", p, "-p", "Hello there", "-n", "100", "--temp", "0", "-c", "8", "--json"]);
    let v: serde_json::Value = serde_json::from_str(stdout(&out).trim()).unwrap();
    assert_eq!(v["finish_reason"], "length");
    assert!(String::from_utf8_lossy(&out.stderr).contains("context"), "stderr explains the stop");
}

#[test]
fn prompt_sources_and_limits() {
    let dir = tempdir();
    let model = dir.path().join("tiny.gguf");
    build(Spec::llama(GgmlType::Q8_0), 5).write_file(&model).unwrap();
    let m = model.to_str().unwrap();
    // -p, -f and stdin all work on a synthetic model (its text is noise, but it must be produced).
    let out = stdout(&infer(&["run", m, "-p", "abc", "-n", "4", "--temp", "0", "--ignore-eos", "--json"]));
    let v: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(v["tokens"].as_array().unwrap().len(), 4);
    let prompt_file = dir.path().join("prompt.txt");
    std::fs::write(&prompt_file, "hello from a file").unwrap();
    stdout(&infer(&["run", m, "-f", prompt_file.to_str().unwrap(), "-n", "2", "--ignore-eos"]));
    let mut child = infer_bin()
        .args(["run", m, "-n", "2", "--ignore-eos"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::Write;
    child.stdin.take().unwrap().write_all(b"from stdin").unwrap();
    assert!(child.wait_with_output().unwrap().status.success());

    // A prompt longer than the context: both counts in the message.
    let long = "x ".repeat(300);
    assert_clean_failure(&infer(&["run", m, "-p", &long, "-c", "16"]), "context holds 16");
    // Bad flags fail before loading anything.
    assert_clean_failure(&infer(&["run", m, "-p", "a", "--temp", "nan"]), "--temp");
    assert_clean_failure(&infer(&["run", m, "-p", "a", "--top-p", "1.5"]), "--top-p");
    assert_clean_failure(&infer(&["run", m, "-p", "a", "-n", "-5"]), "-n");
    assert_clean_failure(&infer(&["run", m, "-p", "a", "--stop", ""]), "stop");
    assert_clean_failure(&infer(&["run", m, "-f", dir.path().join("nope.txt").to_str().unwrap()]), "nope.txt");
    let bad_utf8 = dir.path().join("bad.txt");
    std::fs::write(&bad_utf8, [0xff, 0xfe, 0x41]).unwrap();
    assert_clean_failure(&infer(&["run", m, "-f", bad_utf8.to_str().unwrap()]), "UTF-8");
}

#[test]
fn ctrl_c_stops_generation_and_keeps_the_text() {
    let Some(path) = real_model("smollm2") else { return };
    let args = ["run", path.to_str().unwrap(), "-p", "Once upon a time", "-n", "100000", "--ignore-eos", "-c", "8192"];
    // Ctrl-C once the first token is decoded (the timeline's mark on stderr): by then the handler, installed after
    // the model loads, is in place, and there is text to keep.
    let child = crate::faults::spawn_with_timeline(&[&args[..], &["--temp", "0", "--json"]].concat());
    let out = crate::faults::interrupt_when(child, crate::faults::DECODED);
    let v: serde_json::Value = serde_json::from_str(stdout(&out).trim()).expect("the final JSON is still printed");
    assert_eq!(v["finish_reason"], "cancelled");
    assert!(!v["text"].as_str().unwrap().is_empty(), "what was generated before Ctrl-C is kept");
    assert!(String::from_utf8_lossy(&out.stderr).contains("interrupted"));
}

#[test]
fn a_bad_infer_isa_is_reported_by_every_command_that_loads_a_model_and_by_info() {
    let dir = tempdir();
    let model = dir.path().join("tiny.gguf");
    build(Spec::llama(GgmlType::Q4_1), 6).write_file(&model).unwrap();
    let m = model.to_str().unwrap();
    // Loading repacks weights for the kernel level, so the level must be checked before the model is loaded.
    for args in [
        vec!["run", m, "-p", "a", "-n", "1"],
        vec!["logits", m],
        vec!["bench", m, "-p", "8", "-n", "1", "-r", "1"],
        vec!["info", m],
    ] {
        let out =
            infer_bin().args(&args).env("INFER_ISA", "bogus").stdin(std::process::Stdio::null()).output().unwrap();
        assert_clean_failure(&out, "INFER_ISA");
    }
}

#[test]
fn timings_go_to_stderr_with_verbose_and_never_to_a_pipe() {
    let dir = tempdir();
    let model = dir.path().join("tiny.gguf");
    build(Spec::llama(GgmlType::Q8_0), 5).write_file(&model).unwrap();
    let m = model.to_str().unwrap();
    let quiet = infer(&["run", m, "-p", "abc", "-n", "2", "--ignore-eos"]);
    assert!(quiet.status.success());
    assert!(!String::from_utf8_lossy(&quiet.stderr).contains("[ load"), "stdout is a pipe: no timing line");
    let verbose = infer(&["run", m, "-p", "abc", "-n", "2", "--ignore-eos", "-v"]);
    let err = String::from_utf8_lossy(&verbose.stderr);
    let line = err.lines().find(|l| l.starts_with("[ load ")).unwrap_or_else(|| panic!("no timing line: {err}"));
    assert!(line.contains("prompt 3 tokens") && line.contains("generation 2 tokens") && line.ends_with(']'), "{line}");
    // The memory account: the map, the panels, the KV cache as reserved (its pages fill as positions do), the rest.
    let mem = err.lines().find(|l| l.starts_with("[ memory: ")).unwrap_or_else(|| panic!("no memory line: {err}"));
    for part in
        ["weights ", " mapped", "| panels ", "| KV ", " reserved |", "| KV in use, scratch and the rest ", "| RSS "]
    {
        assert!(mem.contains(part), "{part:?} missing from {mem}");
    }
}

/// `--kv-type q8_0`: generation runs with the 8-bit cache where the heads are whole blocks of 32, and every
/// command that builds a cache refuses it with one clear line (not a panic) where they are not.
#[test]
fn q8_kv_cache_runs_or_is_refused_by_head_width() {
    let dir = tempdir();
    let (wide, narrow) = (dir.path().join("heads32.gguf"), dir.path().join("heads16.gguf"));
    build(Spec { head_dim: 32, ..Spec::llama(GgmlType::Q4_0) }, 5).write_file(&wide).unwrap();
    build(Spec::llama(GgmlType::Q4_0), 5).write_file(&narrow).unwrap();
    let (w, n) = (wide.to_str().unwrap(), narrow.to_str().unwrap());
    let run = ["-p", "abc", "-n", "40", "--temp", "0", "--ignore-eos", "--json", "--kv-type", "q8_0"];
    let out = stdout(&infer(&[&["run", w][..], &run].concat()));
    let v: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(v["tokens"].as_array().unwrap().len(), 40);
    let refused = "not a multiple of 32";
    assert_clean_failure(&infer(&[&["run", n][..], &run].concat()), refused);
    assert_clean_failure(&infer(&["bench", n, "-p", "16", "-n", "0", "-r", "1", "--kv-type", "q8_0"]), refused);
    assert_clean_failure(&infer(&["bench", n, "--batch", "2", "-r", "1", "--kv-type", "q8_0"]), refused);
    assert_clean_failure(&infer(&["serve", n, "--port", "0", "--kv-type", "q8_0"]), refused);
    let text = dir.path().join("text.txt");
    std::fs::write(&text, "some words to score ".repeat(40)).unwrap();
    let t = text.to_str().unwrap();
    assert_clean_failure(&infer(&["perplexity", n, "-f", t, "-c", "32", "--kv-type", "q8_0"]), refused);
    assert_clean_failure(&infer(&["compare", w, n, "-f", t, "-c", "32", "--kv-type", "q8_0"]), refused);
    // clap names the flag and lists the types it takes.
    let out = infer(&["run", w, "-p", "a", "--kv-type", "q4"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.code() == Some(2) && err.contains("'--kv-type <T>'") && err.contains("q8_0"), "{err}");
}

/// The default thread count follows the CPUs the process may use: one per core of its affinity mask (run under
/// `taskset`), reported by `info` and used by `run`; asking for more threads than usable CPUs warns.
#[test]
fn threads_default_to_the_usable_cores_and_too_many_warn() {
    let dir = tempdir();
    let model = dir.path().join("m.gguf");
    build(Spec::llama(GgmlType::Q8_0), 5).write_file(&model).unwrap();
    let m = model.to_str().unwrap();
    let pinned = |args: &[&str]| {
        let out = std::process::Command::new("taskset")
            .args(["-c", "0"])
            .arg(env!("CARGO_BIN_EXE_infer"))
            .args(args)
            .output()
            .expect("taskset (util-linux) runs infer on CPU 0");
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        out
    };
    let cpus =
        |out: &std::process::Output| serde_json::from_slice::<serde_json::Value>(&out.stdout).unwrap()["cpus"].clone();

    let all = cpus(&infer(&["info", m, "--json"]));
    let online = all["online_cpus"].as_u64().unwrap();
    assert!(all["default_threads"].as_u64().unwrap() >= 1, "{all}");
    assert_eq!(
        all["usable_cpus"],
        all["cores"].as_array().unwrap().iter().map(|c| c["cpus"].as_array().unwrap().len()).sum::<usize>()
    );

    let one = cpus(&pinned(&["info", m, "--json"]));
    assert_eq!((one["usable_cpus"].as_u64(), one["default_threads"].as_u64()), (Some(1), Some(1)), "{one}");
    assert_eq!(one["cores"][0]["cpus"], serde_json::json!([0]));
    let line = String::from_utf8(pinned(&["info", m]).stdout).unwrap();
    let line = line.lines().find(|l| l.starts_with("cpus:")).expect("a cpus: line");
    assert!(line.contains("1 core, ") && line.ends_with("; 1 thread by default (one per core)"), "{line}");
    if online > 1 {
        assert!(line.contains(&format!("this process may use 1 of {online} CPUs")), "{line}");
    }

    let run = |extra: &[&str]| {
        let mut args = vec!["run", m, "-p", "abc", "-n", "2", "-c", "64", "--ignore-eos", "--json"];
        args.extend_from_slice(extra);
        pinned(&args)
    };
    let out = run(&[]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["timings"]["threads"], 1);
    assert!(!String::from_utf8_lossy(&out.stderr).contains("usable CPUs"), "{}", String::from_utf8_lossy(&out.stderr));
    let out = run(&["-t", "3"]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["timings"]["threads"], 3);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("warning: 3 threads on 1 usable CPUs"), "{stderr}");
}
