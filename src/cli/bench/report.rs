//! The report formats: records with llama-bench's field names, as a markdown table, JSON, JSON lines or CSV.

use std::fmt::Write as _;

use serde::Serialize;

/// One result: a pp/tg test or one point of the batching curve. Field names follow llama-bench's JSON where one
/// exists.
#[derive(Debug, Clone, Serialize)]
pub struct Record {
    pub build: String,
    pub model_filename: String,
    pub model_type: String,
    pub model_size: u64,
    pub model_n_params: u64,
    pub isa: String,
    pub n_threads: usize,
    pub precision: String,
    pub type_kv: String,
    pub n_ubatch: usize,
    /// "pp512", "tg128", or "pp16+tg24 x16" for the batching curve.
    pub test: String,
    pub n_prompt: usize,
    pub n_gen: usize,
    /// Positions cached before the timed part (-d; 0 for the batching curve).
    pub n_depth: usize,
    /// Parallel sequences (1 for pp/tg).
    pub batch: usize,
    /// Time per repetition: the whole test for pp/tg, the generation phase (T_TG) for the batching curve.
    pub avg_ns: u64,
    pub stddev_ns: u64,
    /// Tokens/s: n_prompt or n_gen over the time for pp/tg, the aggregate generation rate (S_TG) for the batching
    /// curve.
    pub avg_ts: f64,
    pub stddev_ts: f64,
    pub samples_ns: Vec<u64>,
    pub samples_ts: Vec<f64>,
    /// CPU time of all threads per repetition (same phase as samples_ns), where the OS reports it.
    pub samples_cpu_ns: Option<Vec<u64>>,
    /// Tokens per second of CPU time per thread: tokens / (CPU seconds / n_threads): the rate if every thread had a
    /// core to itself and never idled. On a busy machine it estimates (from above) what an idle one would give.
    pub avg_ts_cpu: Option<f64>,
    /// The memory read probe's rate at this thread count, GB/s (with --bandwidth): the best of the probes run
    /// before the tests and after each one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mem_read_gbs: Option<f64>,
    /// The lowest of those probes and how many ran: how far the machine's read rate moved during the run.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mem_read_gbs_low: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mem_read_probes: Option<usize>,
    /// The compute probes at this thread count (with --peak): f32 FMA GFLOP/s, and the integer multiply-add
    /// of the level's quantized kernels in billions per second.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub peak_fma_gflops: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub peak_int_gmacs: Option<f64>,
    /// For pp tests with --peak: the layers' matrix products per second, GFLOP/s (2 × multiply-adds), and their
    /// share of the peak of the instruction those products run on.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub matrix_gflops: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub peak_share: Option<f64>,
    #[serde(flatten, skip_serializing_if = "Option::is_none")]
    pub curve: Option<CurvePoint>,
}

/// The llama-batched-bench figures of one batch size (means over the repetitions).
#[derive(Debug, Clone, Serialize)]
pub struct CurvePoint {
    /// Positions cached at the end: B·(PP+TG).
    pub n_kv: usize,
    /// Prefill time of all B prompts, seconds.
    pub t_pp: f64,
    /// Aggregate prefill rate B·PP/T_PP, tokens/s (0 without a prompt).
    pub s_pp: f64,
    pub stddev_s_pp: f64,
    /// Generation time, seconds.
    pub t_tg: f64,
    /// Aggregate generation rate B·TG/T_TG, tokens/s.
    pub s_tg: f64,
    pub stddev_s_tg: f64,
    /// Milliseconds per decode step (one forward call over all B sequences).
    pub ms_per_step: f64,
    /// S_TG over S_TG at B = 1 for the same model, threads and lengths (null when B = 1 was not run).
    pub speedup: Option<f64>,
}

/// Mean and sample standard deviation (0 for a single sample).
pub(super) fn mean_sd(xs: &[f64]) -> (f64, f64) {
    let n = xs.len() as f64;
    if xs.is_empty() {
        return (0.0, 0.0);
    }
    let mean = xs.iter().sum::<f64>() / n;
    if xs.len() < 2 {
        return (mean, 0.0);
    }
    let var = xs.iter().map(|x| (x - mean) * (x - mean)).sum::<f64>() / (n - 1.0);
    (mean, var.sqrt())
}

/// Speed-up of each curve point over B = 1 with the same model, threads and lengths.
pub(super) fn fill_speedups(records: &mut [Record]) {
    let key = |r: &Record| (r.model_filename.clone(), r.n_threads, r.n_prompt, r.n_gen);
    let bases: Vec<_> = records
        .iter()
        .filter(|r| r.curve.is_some() && r.batch == 1)
        .map(|r| (key(r), r.curve.as_ref().map_or(0.0, |c| c.s_tg)))
        .collect();
    for r in records.iter_mut() {
        let k = key(r);
        if let Some(c) = r.curve.as_mut() {
            c.speedup = bases.iter().find(|(bk, s)| *bk == k && *s > 0.0).map(|(_, s)| c.s_tg / s);
        }
    }
}

/// "97.93 MiB", "1.23 GiB" (llama-bench's size column).
fn size_str(bytes: u64) -> String {
    let b = bytes as f64;
    if b >= 1024.0 * 1024.0 * 1024.0 {
        format!("{:.2} GiB", b / (1024.0 * 1024.0 * 1024.0))
    } else if b >= 1024.0 * 1024.0 {
        format!("{:.2} MiB", b / (1024.0 * 1024.0))
    } else {
        format!("{:.2} KiB", b / 1024.0)
    }
}

/// "134.52 M", "6.74 B" (llama-bench's params column).
fn params_str(n: u64) -> String {
    let n = n as f64;
    if n >= 1e9 {
        format!("{:.2} B", n / 1e9)
    } else if n >= 1e6 {
        format!("{:.2} M", n / 1e6)
    } else {
        format!("{:.2} K", n / 1e3)
    }
}

/// A markdown table: `right[i]` right-aligns column i.
pub(super) fn md_table(header: &[&str], right: &[bool], rows: &[Vec<String>]) -> String {
    let widths: Vec<usize> = (0..header.len())
        .map(|i| rows.iter().map(|r| r[i].chars().count()).chain([header[i].chars().count(), 3]).max().unwrap_or(3))
        .collect();
    let line = |cells: &[String]| -> String {
        let mut s = String::from("|");
        for (i, c) in cells.iter().enumerate() {
            let pad = widths[i] - c.chars().count();
            if right[i] {
                let _ = write!(s, " {}{} |", " ".repeat(pad), c);
            } else {
                let _ = write!(s, " {}{} |", c, " ".repeat(pad));
            }
        }
        s
    };
    let mut out = line(&header.iter().map(|h| h.to_string()).collect::<Vec<_>>());
    out.push('\n');
    out.push('|');
    for (i, w) in widths.iter().enumerate() {
        if right[i] {
            let _ = write!(out, " {}: |", "-".repeat(w - 1));
        } else {
            let _ = write!(out, " {} |", "-".repeat(*w));
        }
    }
    for r in rows {
        out.push('\n');
        out.push_str(&line(r));
    }
    out
}

pub(super) fn to_markdown(records: &[Record], build: &str) -> String {
    let mut out = String::new();
    let plain: Vec<&Record> = records.iter().filter(|r| r.curve.is_none()).collect();
    if !plain.is_empty() {
        // Columns that only appear when they say something (as llama-bench hides default parameters).
        let show_precision = plain.iter().any(|r| r.precision != "q8x2");
        let show_kv = plain.iter().any(|r| r.type_kv != "f16");
        let mut header = vec!["model", "size", "params", "isa", "threads"];
        let mut right = vec![false, true, true, false, true];
        if show_precision {
            header.push("precision");
            right.push(false);
        }
        if show_kv {
            header.push("type_kv");
            right.push(false);
        }
        header.extend(["test", "t/s"]);
        right.extend([false, true]);
        let show_cpu = plain.iter().any(|r| r.avg_ts_cpu.is_some());
        if show_cpu {
            header.push("t/s (cpu)");
            right.push(true);
        }
        let rows: Vec<Vec<String>> = plain
            .iter()
            .map(|r| {
                let mut row =
                    vec![r.model_type.clone(), size_str(r.model_size), params_str(r.model_n_params), r.isa.clone()];
                row.push(r.n_threads.to_string());
                if show_precision {
                    row.push(r.precision.clone());
                }
                if show_kv {
                    row.push(r.type_kv.clone());
                }
                row.push(r.test.clone());
                row.push(format!("{:.2} ± {:.2}", r.avg_ts, r.stddev_ts));
                if show_cpu {
                    row.push(r.avg_ts_cpu.map_or_else(|| "-".into(), |v| format!("{v:.2}")));
                }
                row
            })
            .collect();
        out.push_str(&md_table(&header, &right, &rows));
        out.push('\n');
    }
    // The batching curve: one table per model, threads and settings, as llama-batched-bench prints.
    let mut groups: Vec<(String, Vec<&Record>)> = Vec::new();
    for r in records.iter().filter(|r| r.curve.is_some()) {
        let title = format!(
            "model: {} ({}, {}), isa: {}, threads: {}, precision: {}, type_kv: {}",
            r.model_type,
            size_str(r.model_size),
            r.model_filename,
            r.isa,
            r.n_threads,
            r.precision,
            r.type_kv
        );
        match groups.iter_mut().find(|(t, _)| *t == title) {
            Some((_, g)) => g.push(r),
            None => groups.push((title, vec![r])),
        }
    }
    for (title, group) in groups {
        if !out.is_empty() {
            out.push('\n');
        }
        let _ = writeln!(out, "{title}\n");
        let header =
            ["PP", "TG", "B", "N_KV", "T_PP s", "S_PP t/s", "T_TG s", "S_TG t/s", "ms/step", "speed-up", "S_TG (cpu)"];
        let rows: Vec<Vec<String>> = group
            .iter()
            .map(|r| {
                let c = r.curve.as_ref().expect("filtered");
                vec![
                    r.n_prompt.to_string(),
                    r.n_gen.to_string(),
                    r.batch.to_string(),
                    c.n_kv.to_string(),
                    format!("{:.3}", c.t_pp),
                    format!("{:.2}", c.s_pp),
                    format!("{:.3}", c.t_tg),
                    format!("{:.2} ± {:.2}", c.s_tg, c.stddev_s_tg),
                    format!("{:.2}", c.ms_per_step),
                    c.speedup.map_or_else(|| "-".into(), |s| format!("{s:.2}x")),
                    r.avg_ts_cpu.map_or_else(|| "-".into(), |v| format!("{v:.2}")),
                ]
            })
            .collect();
        out.push_str(&md_table(&header, &[true; 11], &rows));
        out.push('\n');
    }
    let mut probed = false;
    for r in records.iter().filter(|r| r.n_gen > 0 && r.curve.is_none()) {
        if let Some(gbs) = r.mem_read_gbs {
            probed = true;
            let limit = gbs * 1e9 / r.model_size as f64;
            let spread = match (r.mem_read_probes, r.mem_read_gbs_low) {
                (Some(n), Some(low)) if n > 1 => format!(" (best of {n} probes, the lowest {low:.1})"),
                _ => String::new(),
            };
            let _ = write!(
                out,
                "\nmemory read {gbs:.1} GB/s{spread} on {} threads: {} {} at most {limit:.0} t/s ({} per token); \
                 {:.0}% of it",
                r.n_threads,
                r.model_type,
                r.test,
                size_str(r.model_size),
                100.0 * r.avg_ts / limit
            );
        }
    }
    for r in records.iter().filter(|r| r.curve.is_none()) {
        if let (Some(f), Some(i), Some(m)) = (r.peak_fma_gflops, r.peak_int_gmacs, r.matrix_gflops) {
            probed = true;
            // The scalar level has no peak worth a share, and the amx level's products run on the tile unit,
            // whose peak the probe does not measure: for them the rate is given alone.
            let share = match r.peak_share {
                Some(share) => format!("{:.0}% of the peak its kernels use", 100.0 * share),
                None => format!("no share given at the {} level", r.isa),
            };
            let _ = write!(
                out,
                "\ncompute peak on {} threads ({}): f32 FMA {f:.0} GFLOP/s, integer multiply-add {i:.0} G/s: {} {} \
                 runs its matrix products at {m:.0} GFLOP/s, {share}",
                r.n_threads, r.isa, r.model_type, r.test,
            );
        }
    }
    if probed {
        out.push('\n');
    }
    if records.iter().any(|r| r.avg_ts_cpu.is_some()) {
        let _ = write!(
            out,
            "\n(cpu): tokens × threads / CPU seconds of the process, the rate if every thread had a core to itself and \
             never idled (an upper bound for an idle machine); the wall-clock t/s drops when other work shares the \
             cores.\n"
        );
    }
    let _ = write!(out, "\nbuild: {build}");
    out
}

/// CSV with a header: one row per record, the batching-curve columns empty for pp/tg rows.
pub(super) fn to_csv(records: &[Record]) -> String {
    const COLUMNS: [&str; 32] = [
        "build",
        "model_filename",
        "model_type",
        "model_size",
        "model_n_params",
        "isa",
        "n_threads",
        "precision",
        "type_kv",
        "n_ubatch",
        "test",
        "n_prompt",
        "n_gen",
        "n_depth",
        "batch",
        "avg_ns",
        "stddev_ns",
        "avg_ts",
        "stddev_ts",
        "avg_ts_cpu",
        "mem_read_gbs",
        "mem_read_gbs_low",
        "mem_read_probes",
        "n_kv",
        "t_pp",
        "s_pp",
        "stddev_s_pp",
        "t_tg",
        "s_tg",
        "stddev_s_tg",
        "ms_per_step",
        "speedup",
    ];
    let quote = |s: &str| -> String {
        if s.contains([',', '"', '\n', '\r']) { format!("\"{}\"", s.replace('"', "\"\"")) } else { s.to_string() }
    };
    let mut out = COLUMNS.join(",");
    for r in records {
        let c = r.curve.as_ref();
        let opt = |v: Option<String>| v.unwrap_or_default();
        let cells = [
            quote(&r.build),
            quote(&r.model_filename),
            quote(&r.model_type),
            r.model_size.to_string(),
            r.model_n_params.to_string(),
            quote(&r.isa),
            r.n_threads.to_string(),
            quote(&r.precision),
            quote(&r.type_kv),
            r.n_ubatch.to_string(),
            quote(&r.test),
            r.n_prompt.to_string(),
            r.n_gen.to_string(),
            r.n_depth.to_string(),
            r.batch.to_string(),
            r.avg_ns.to_string(),
            r.stddev_ns.to_string(),
            format!("{:.4}", r.avg_ts),
            format!("{:.4}", r.stddev_ts),
            opt(r.avg_ts_cpu.map(|v| format!("{v:.4}"))),
            opt(r.mem_read_gbs.map(|v| format!("{v:.3}"))),
            opt(r.mem_read_gbs_low.map(|v| format!("{v:.3}"))),
            opt(r.mem_read_probes.map(|n| n.to_string())),
            opt(c.map(|c| c.n_kv.to_string())),
            opt(c.map(|c| format!("{:.6}", c.t_pp))),
            opt(c.map(|c| format!("{:.4}", c.s_pp))),
            opt(c.map(|c| format!("{:.4}", c.stddev_s_pp))),
            opt(c.map(|c| format!("{:.6}", c.t_tg))),
            opt(c.map(|c| format!("{:.4}", c.s_tg))),
            opt(c.map(|c| format!("{:.4}", c.stddev_s_tg))),
            opt(c.map(|c| format!("{:.4}", c.ms_per_step))),
            opt(c.and_then(|c| c.speedup).map(|s| format!("{s:.4}"))),
        ];
        out.push('\n');
        out.push_str(&cells.join(","));
    }
    out
}
