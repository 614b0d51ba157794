//! `infer bench`: runs on a tiny synthetic model and checks that every output format parses and that bad flags
//! fail cleanly. Timing is never asserted (the machine is noisy).

use std::path::{Path, PathBuf};
use std::process::Output;

use infer::kernels::GgmlType;

use crate::common::{infer, tempdir};
use crate::synthetic::{Spec, build};

/// A tiny llama-style model (context 256) in `dir`.
fn tiny_model(dir: &Path) -> PathBuf {
    let path = dir.join("tiny-llama.gguf");
    build(Spec::llama(GgmlType::Q8_0), 7).write_file(&path).expect("write model");
    path
}

fn run_ok(args: &[&str]) -> String {
    let out = infer(args);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "infer {args:?} failed: {stderr}");
    String::from_utf8(out.stdout).expect("utf-8 output")
}

/// Non-zero exit, no panic, a message on stderr mentioning `needle`.
fn assert_fails(out: &Output, needle: &str) {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "expected failure; stderr: {stderr}");
    assert_ne!(out.status.code(), Some(101), "exit code 101 means a panic: {stderr}");
    assert!(!stderr.contains("panicked"), "panicked: {stderr}");
    assert!(stderr.contains(needle), "error should mention {needle:?}: {stderr}");
}

#[test]
fn json_records_carry_the_llama_bench_fields() {
    let dir = tempdir();
    let model = tiny_model(dir.path());
    let text = run_ok(&["bench", model.to_str().unwrap(), "-p", "16", "-n", "8", "-r", "2", "-t", "1", "-o", "json"]);
    let records: Vec<serde_json::Value> = serde_json::from_str(&text).expect("a JSON array");
    let tests: Vec<&str> = records.iter().map(|r| r["test"].as_str().unwrap()).collect();
    assert_eq!(tests, ["pp16", "tg8"]);
    for r in &records {
        for key in [
            "model_filename",
            "model_type",
            "model_size",
            "model_n_params",
            "isa",
            "precision",
            "n_threads",
            "n_prompt",
            "n_gen",
            "batch",
            "avg_ns",
            "stddev_ns",
            "avg_ts",
            "stddev_ts",
        ] {
            assert!(r.get(key).is_some_and(|v| !v.is_null()), "record lacks {key}: {r}");
        }
        assert_eq!(r["n_threads"], 1);
        assert!(r["avg_ts"].as_f64().unwrap() > 0.0);
        assert_eq!(r["samples_ts"].as_array().unwrap().len(), 2);
        assert_eq!(r["samples_ns"].as_array().unwrap().len(), 2);
        assert!(r["model_type"].as_str().unwrap().starts_with("llama "), "{r}");
        // CPU time is reported where the OS gives it (Linux); runs this short can be below its resolution.
        if cfg!(target_os = "linux") {
            assert_eq!(r["samples_cpu_ns"].as_array().unwrap().len(), 2);
        }
        assert!(r["avg_ts_cpu"].is_null() || r["avg_ts_cpu"].as_f64().unwrap() > 0.0, "{r}");
    }
    assert_eq!(records[0]["n_prompt"], 16);
    assert_eq!(records[0]["n_gen"], 0);
    assert_eq!(records[1]["n_prompt"], 0);
    assert_eq!(records[1]["n_gen"], 8);
}

#[test]
fn csv_and_markdown_and_sweeps() {
    let dir = tempdir();
    let model = tiny_model(dir.path());
    let m = model.to_str().unwrap();
    // Two thread counts, two prompt lengths, no tg: 4 rows.
    let csv = run_ok(&["bench", m, "-p", "8,16", "-n", "0", "-r", "1", "-t", "1,2", "-o", "csv"]);
    let lines: Vec<&str> = csv.lines().collect();
    assert_eq!(lines.len(), 5, "header + 4 rows:\n{csv}");
    let header: Vec<&str> = lines[0].split(',').collect();
    let col = |name: &str| header.iter().position(|h| *h == name).unwrap_or_else(|| panic!("no column {name}"));
    let (test, threads, ts) = (col("test"), col("n_threads"), col("avg_ts"));
    let mut seen = Vec::new();
    for row in &lines[1..] {
        let cells: Vec<&str> = row.split(',').collect();
        assert_eq!(cells.len(), header.len(), "{row}");
        assert!(cells[ts].parse::<f64>().unwrap() > 0.0);
        seen.push(format!("{}@{}", cells[test], cells[threads]));
    }
    seen.sort();
    assert_eq!(seen, ["pp16@1", "pp16@2", "pp8@1", "pp8@2"]);

    let md = run_ok(&["bench", m, "-p", "8", "-n", "4", "-r", "2", "-t", "1", "--no-warmup"]);
    let table: Vec<&str> = md.lines().filter(|l| l.starts_with('|')).collect();
    assert_eq!(table.len(), 4, "header, rule, 2 rows:\n{md}");
    assert!(table[0].contains("model") && table[0].contains("t/s") && table[0].contains("test"), "{md}");
    assert!(table[1].contains("---"), "{md}");
    assert!(table[2].contains("pp8") && table[2].contains(" ± "), "{md}");
    assert!(table[3].contains("tg4"), "{md}");
}

#[test]
fn depth_runs_each_test_after_a_filled_cache() {
    let dir = tempdir();
    let model = tiny_model(dir.path());
    let args =
        ["bench", model.to_str().unwrap(), "-p", "8", "-n", "4", "-d", "0,40", "-r", "1", "-t", "1", "-o", "json"];
    let records: Vec<serde_json::Value> = serde_json::from_str(&run_ok(&args)).expect("a JSON array");
    let got: Vec<(&str, u64)> =
        records.iter().map(|r| (r["test"].as_str().unwrap(), r["n_depth"].as_u64().unwrap())).collect();
    assert_eq!(got, [("pp8", 0), ("tg4", 0), ("pp8 @ d40", 40), ("tg4 @ d40", 40)]);
    for r in &records {
        assert!(r["avg_ts"].as_f64().unwrap() > 0.0, "{r}");
    }
    // Only the context limits the depth: 250 cached positions and 6 more tokens fill the 256 exactly.
    let full = ["bench", model.to_str().unwrap(), "-p", "6", "-n", "0", "-d", "250", "-r", "1", "-t", "1", "-o", "csv"];
    let csv = run_ok(&full);
    let header: Vec<&str> = csv.lines().next().unwrap().split(',').collect();
    let row: Vec<&str> = csv.lines().nth(1).unwrap().split(',').collect();
    let depth = header.iter().position(|h| *h == "n_depth").expect("an n_depth column");
    assert_eq!(row[depth], "250");
}

#[test]
fn bandwidth_probe_is_reported_with_the_tests() {
    let dir = tempdir();
    let model = tiny_model(dir.path());
    let m = model.to_str().unwrap();
    let args = ["bench", m, "-p", "4", "-n", "4", "-r", "1", "-t", "1", "--bandwidth", "-o", "json"];
    let records: Vec<serde_json::Value> = serde_json::from_str(&run_ok(&args)).expect("a JSON array");
    assert_eq!(records.len(), 2, "{records:?}");
    for r in &records {
        let gbs = r["mem_read_gbs"].as_f64().unwrap_or_else(|| panic!("no mem_read_gbs: {r}"));
        assert!(gbs > 0.1 && gbs < 10_000.0, "{r}");
        // One probe before the tests and one after each of the two; the best counts for both records.
        assert_eq!(r["mem_read_probes"].as_u64(), Some(3), "{r}");
        let low = r["mem_read_gbs_low"].as_f64().unwrap_or_else(|| panic!("no mem_read_gbs_low: {r}"));
        assert!(low > 0.0 && low <= gbs, "{r}");
        assert_eq!(r["mem_read_gbs"], records[0]["mem_read_gbs"], "one best rate per thread count");
    }
    let md = run_ok(&["bench", m, "-p", "0", "-n", "4", "-r", "1", "-t", "1", "--bandwidth"]);
    assert!(
        md.contains("memory read") && md.contains("(best of 2 probes, the lowest") && md.contains("tg4 at most"),
        "{md}"
    );
    let plain = run_ok(&["bench", m, "-p", "0", "-n", "4", "-r", "1", "-t", "1", "-o", "json"]);
    assert!(!plain.contains("mem_read_gbs"), "the probe runs only when asked: {plain}");
}

#[test]
fn compute_peak_is_reported_with_the_prompt_tests() {
    let dir = tempdir();
    let model = tiny_model(dir.path());
    let m = model.to_str().unwrap();
    let args = ["bench", m, "-p", "8", "-n", "2", "-r", "1", "-t", "1", "--peak", "-o", "json"];
    let records: Vec<serde_json::Value> = serde_json::from_str(&run_ok(&args)).expect("a JSON array");
    assert_eq!(records.len(), 2, "{records:?}");
    for r in &records {
        let fma = r["peak_fma_gflops"].as_f64().unwrap_or_else(|| panic!("no peak_fma_gflops: {r}"));
        let int = r["peak_int_gmacs"].as_f64().unwrap_or_else(|| panic!("no peak_int_gmacs: {r}"));
        // Any CPU this runs on does between a tenth of a billion and a few thousand billion per second.
        assert!((0.1..1e5).contains(&fma) && (0.1..1e5).contains(&int), "{r}");
        let isa = r["isa"].as_str().unwrap();
        if r["n_prompt"].as_u64() == Some(8) {
            let matrix = r["matrix_gflops"].as_f64().unwrap_or_else(|| panic!("no matrix_gflops: {r}"));
            assert!(matrix > 0.0, "{r}");
            match r["peak_share"].as_f64() {
                // The share is the products' rate over the peak of one of the two instructions (the integer one
                // counting one or two parts per weight), so it must match one of those quotients.
                Some(share) => {
                    let candidates = [matrix / fma, matrix / 2.0 / int, matrix / int];
                    assert!(candidates.iter().any(|c| (c - share).abs() <= 1e-9 * c.max(1.0)), "{r}");
                }
                // The scalar level has no peak worth a share, and the amx level's products run on the tile
                // unit, whose peak is not probed.
                None => assert!(isa == "scalar" || isa == "amx", "only the scalar and amx levels have no share: {r}"),
            }
        } else {
            assert!(r.get("matrix_gflops").is_none() && r.get("peak_share").is_none(), "tg has no share: {r}");
        }
    }
    let md = run_ok(&["bench", m, "-p", "8", "-n", "0", "-r", "1", "-t", "1", "--peak"]);
    assert!(md.contains("compute peak on 1 threads") && md.contains("f32 FMA"), "{md}");
    let plain = run_ok(&["bench", m, "-p", "8", "-n", "0", "-r", "1", "-t", "1", "-o", "json"]);
    assert!(!plain.contains("peak_fma_gflops"), "the probe runs only when asked: {plain}");
}

#[test]
fn batching_curve_records_and_plot() {
    let dir = tempdir();
    let model = tiny_model(dir.path());
    let plot = dir.path().join("curve.svg");
    let args = [
        "bench",
        model.to_str().unwrap(),
        "--batch",
        "1,2",
        "--batch-prompt",
        "4",
        "--batch-gen",
        "3",
        "-r",
        "1",
        "-t",
        "1",
        "-o",
        "json",
        "--plot",
        plot.to_str().unwrap(),
    ];
    let text = run_ok(&args);
    let records: Vec<serde_json::Value> = serde_json::from_str(&text).expect("a JSON array");
    assert_eq!(records.len(), 2, "only the curve runs with --batch: {text}");
    for (r, b) in records.iter().zip([1, 2]) {
        assert_eq!(r["batch"], b);
        assert_eq!(r["n_prompt"], 4);
        assert_eq!(r["n_gen"], 3);
        assert_eq!(r["n_kv"], b * 7);
        assert!(r["s_pp"].as_f64().unwrap() > 0.0, "{r}");
        assert!(r["s_tg"].as_f64().unwrap() > 0.0, "{r}");
        assert!(r["t_tg"].as_f64().unwrap() > 0.0, "{r}");
        assert!(r["ms_per_step"].as_f64().unwrap() > 0.0, "{r}");
    }
    assert!((records[0]["speedup"].as_f64().unwrap() - 1.0).abs() < 1e-9);
    let svg = std::fs::read_to_string(&plot).expect("the plot was written");
    assert!(svg.contains("<svg") && svg.len() > 1000, "an SVG chart");
    assert!(svg.contains("\nlinear\n") && svg.contains(" t1 "), "the legends name the reference line and the series");

    // Curve and pp/tg together, markdown, PNG chart.
    let png = dir.path().join("all.png");
    let md = run_ok(&[
        "bench",
        model.to_str().unwrap(),
        "-p",
        "8",
        "-n",
        "4",
        "--batch",
        "1,2",
        "--batch-prompt",
        "0",
        "--batch-gen",
        "2",
        "-r",
        "1",
        "-t",
        "1",
        "--plot",
        png.to_str().unwrap(),
    ]);
    assert!(md.contains("S_TG t/s") && md.contains("speed-up") && md.contains("pp8"), "{md}");
    let bytes = std::fs::read(&png).expect("the PNG was written");
    assert!(bytes.starts_with(b"\x89PNG") && bytes.len() > 1000);
}

#[test]
fn bad_flags_fail_cleanly() {
    let dir = tempdir();
    let model = tiny_model(dir.path());
    let m = model.to_str().unwrap();
    let cases: [(&[&str], &str); 11] = [
        (&["-r", "0"], "repetition"),
        // The depth counts toward the context: 200 + 100 > 256.
        (&["-p", "100", "-n", "0", "-d", "200"], "-d 200"),
        (&["-d", "-1"], "-1"),
        (&["-t", "0"], "thread"),
        (&["--batch", "0"], "batch"),
        (&["-p", "-5"], "-5"),
        (&["-n", "x"], "x"),
        (&["-p", "1000"], "context"),
        (&["-p", "0", "-n", "0"], "nothing to run"),
        (&["-o", "xml"], "xml"),
        (&["--plot", "chart.gif"], ".svg"),
    ];
    for (extra, needle) in cases {
        let mut args = vec!["bench", m];
        if !extra.contains(&"-r") {
            args.extend(["-r", "1"]);
        }
        args.extend_from_slice(extra);
        assert_fails(&infer(&args), needle);
    }
    assert_fails(&infer(&["bench", "/no/such/model.gguf"]), "No such file");
}
