//! `infer compare BASE OTHER`: how far OTHER's predictions are from BASE's (see [`crate::eval`]), with sizes,
//! speeds and the two greedy continuations side by side.

use std::path::PathBuf;
use std::sync::atomic::Ordering;

use anyhow::Context;
use clap::Args;
use serde::Serialize;

use super::EngineArgs;
use super::args::ThreadArgs;
use super::output::{eprint_lossy, eprintln_lossy, print_line};
use super::perplexity::{ChunkArgs, read_text};
use crate::eval::{
    DivergenceReport, EvalError, Greedy, common_prefix, compare_continuation, compare_text, greedy, tokenize_text,
};
use crate::registry::human_size;

#[derive(Args, Debug)]
pub struct CompareArgs {
    /// The reference model (a GGUF file or a registry name).
    #[arg(value_name = "BASE")]
    pub base: String,
    /// The model to measure against it; it must have the same vocabulary.
    #[arg(value_name = "OTHER")]
    pub other: String,
    /// Greedy-generate from this prompt with BASE, then score OTHER on the same tokens; both continuations are
    /// shown.
    #[arg(short = 'p', long, value_name = "PROMPT", required_unless_present = "file")]
    pub prompt: Option<String>,
    /// Tokens to generate for -p.
    #[arg(short = 'n', long = "n-predict", value_name = "N", default_value_t = 64,
          value_parser = clap::value_parser!(u32).range(1..=65536))]
    pub n_predict: u32,
    /// Score a text instead (or as well), in chunks of -c tokens as llama-perplexity does.
    #[arg(short = 'f', long = "file", value_name = "TEXT_FILE")]
    pub file: Option<PathBuf>,
    #[command(flatten)]
    pub chunking: ChunkArgs,
    /// Print one JSON object instead of a table.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub threads: ThreadArgs,
    #[command(flatten)]
    pub engine: EngineArgs,
}

/// One model's side of the report.
#[derive(Debug, Serialize)]
struct ModelSide {
    path: String,
    file_bytes: u64,
    bits_per_weight: f64,
    /// Prompt processing (prefill) and generation rates, tokens/s: from the -p run, or prefill from -f.
    prompt_tps: Option<f64>,
    generate_tps: Option<f64>,
    greedy_text: Option<String>,
}

#[derive(Debug, Serialize)]
struct Report {
    base: ModelSide,
    other: ModelSide,
    /// Where the statistics come from: "text" (-f) or "generation" (BASE's greedy continuation of -p).
    scored: &'static str,
    #[serde(flatten)]
    divergence: DivergenceReport,
    /// Greedy tokens both models generate alike before they first differ (with -p).
    greedy_common_prefix: Option<usize>,
    greedy_tokens: Option<usize>,
    /// With -f: the chunks scored, of how many.
    chunks: Option<(usize, usize)>,
    /// Ctrl-C stopped the comparison: the statistics cover what finished before it (text chunks; a greedy
    /// continuation in progress is dropped).
    interrupted: bool,
}

pub fn run(args: CompareArgs) -> anyhow::Result<()> {
    let text = args.file.as_deref().map(read_text).transpose()?;
    // Ctrl-C stops after the text chunk (or greedy token) in progress; what finished is still reported.
    let cancel = super::cancel_on_ctrl_c();
    let cancelled = || cancel.load(Ordering::SeqCst);
    let base = super::load(Some(&args.base), &args.engine)?;
    let other = super::load_model(Some(&args.other), &args.engine)?.1;
    // Both models run with the KV cache `--kv-type` names.
    let kv = args.engine.kv_dtype();
    kv.check(&base.model.config)?;
    kv.check(&other.config)?;
    let side = |m: &crate::model::Model| ModelSide {
        path: m.file().path().display().to_string(),
        file_bytes: m.file().file_len(),
        bits_per_weight: m.file().tensor_bytes_total() as f64 * 8.0 / m.file().parameter_count().max(1) as f64,
        prompt_tps: None,
        generate_tps: None,
        greedy_text: None,
    };
    let mut report = Report {
        base: side(&base.model),
        other: side(&other),
        scored: if text.is_some() { "text" } else { "generation" },
        divergence: crate::eval::Divergence::default().report(),
        greedy_common_prefix: None,
        greedy_tokens: None,
        chunks: None,
        interrupted: false,
    };
    let json = args.json;
    args.threads
        .install(|| -> anyhow::Result<()> {
            if let Some(prompt) = &args.prompt {
                let ids = base.tokenizer.encode(prompt, true, false);
                let n = args.n_predict as usize;
                let gb = greedy(&base.model, &base.tokenizer, &ids, n, kv, &cancel)?;
                let go = greedy(&other, &base.tokenizer, &ids, n, kv, &cancel)?;
                if cancelled() {
                    // A continuation was cut short: comparing it would compare the interruption.
                    return Ok(());
                }
                report.greedy_common_prefix = Some(common_prefix(&gb.tokens, &go.tokens));
                report.greedy_tokens = Some(gb.tokens.len());
                if text.is_none() {
                    let all: Vec<u32> = ids.iter().chain(&gb.tokens).copied().collect();
                    report.divergence = compare_continuation(&base.model, &other, &all, ids.len(), kv)?;
                }
                fill(&mut report.base, gb);
                fill(&mut report.other, go);
            }
            if let Some(text) = &text {
                let tokens = tokenize_text(&base.tokenizer, text);
                let bos = base.tokenizer.add_bos().then(|| base.tokenizer.bos()).flatten();
                let mut on_chunk = |i: usize, n: usize| {
                    report.chunks = Some((i + 1, n));
                    if !json {
                        eprint_lossy!("\rchunk {}/{n}", i + 1);
                        if i + 1 == n {
                            eprintln_lossy!();
                        }
                    }
                };
                let chunks = args.chunking.chunks.map(|c| c as usize);
                let scored = compare_text(
                    &base.model,
                    &other,
                    &tokens,
                    args.chunking.ctx as usize,
                    kv,
                    chunks,
                    bos,
                    &cancel,
                    &mut on_chunk,
                );
                let (div, rates) = match scored {
                    Err(EvalError::Cancelled) => return Ok(()),
                    r => r.context("scoring the text")?,
                };
                report.divergence = div;
                report.base.prompt_tps = report.base.prompt_tps.or(Some(rates[0]));
                report.other.prompt_tps = report.other.prompt_tps.or(Some(rates[1]));
            }
            Ok(())
        })
        .context("starting worker threads")??;
    report.interrupted = cancelled();
    if report.interrupted && !json && report.chunks.is_some_and(|(done, n)| done < n) {
        eprintln_lossy!();
    }
    if json {
        print_line(&serde_json::to_string(&report)?)?;
    } else {
        print_table(&report)?;
    }
    if report.interrupted {
        return Err(super::Interrupted.into());
    }
    Ok(())
}

fn fill(side: &mut ModelSide, g: Greedy) {
    side.prompt_tps = Some(g.prompt_tps);
    side.generate_tps = Some(g.generate_tps);
    side.greedy_text = Some(g.text);
}

fn print_table(r: &Report) -> std::io::Result<()> {
    let f = |v: Option<f64>, digits: usize| v.map_or_else(|| "-".to_string(), |x| format!("{x:.digits$}"));
    let d = &r.divergence;
    let rows: Vec<(String, String, String)> = vec![
        ("file".into(), r.base.path.clone(), r.other.path.clone()),
        ("size".into(), human_size(r.base.file_bytes), human_size(r.other.file_bytes)),
        ("bits per weight".into(), format!("{:.2}", r.base.bits_per_weight), format!("{:.2}", r.other.bits_per_weight)),
        ("perplexity".into(), f(d.ppl_base, 4), f(d.ppl_other, 4)),
        ("prompt t/s".into(), f(r.base.prompt_tps, 1), f(r.other.prompt_tps, 1)),
        ("generation t/s".into(), f(r.base.generate_tps, 1), f(r.other.generate_tps, 1)),
    ];
    let w0 = rows.iter().map(|r| r.0.len()).max().unwrap_or(0).max(16);
    let w1 = rows.iter().map(|r| r.1.chars().count()).max().unwrap_or(0).max(4);
    print_line(&format!("{:<w0$}  {:<w1$}  {}", "", "BASE", "OTHER"))?;
    for (k, a, b) in &rows {
        print_line(&format!("{k:<w0$}  {a:<w1$}  {b}"))?;
    }
    print_line("")?;
    let chunks = match r.chunks {
        Some((done, n)) if r.interrupted => format!(", {done} of {n} chunks: interrupted"),
        _ if r.interrupted => ", interrupted".to_string(),
        _ => String::new(),
    };
    print_line(&format!("scored positions   {} ({}{chunks})", d.positions, r.scored))?;
    print_line(&format!("top1_agreement     {}", f(d.top1_agreement, 4)))?;
    print_line(&format!("kld_mean           {}", f(d.kld_mean, 6)))?;
    print_line(&format!("kld_median         {}", f(d.kld_median, 6)))?;
    print_line(&format!("kld_p99            {}", f(d.kld_p99, 6)))?;
    print_line(&format!("kld_max            {}", f(d.kld_max, 6)))?;
    print_line(&format!("delta_p_mean       {}", f(d.delta_p_mean.map(|x| 100.0 * x), 3) + " %"))?;
    if let (Some(common), Some(n)) = (r.greedy_common_prefix, r.greedy_tokens) {
        print_line(&format!("greedy_common_prefix {common} of {n} tokens"))?;
        print_line("")?;
        print_columns(r.base.greedy_text.as_deref().unwrap_or(""), r.other.greedy_text.as_deref().unwrap_or(""))?;
    }
    Ok(())
}

/// The two greedy texts side by side, each wrapped to its column (newlines shown as ⏎).
fn print_columns(base: &str, other: &str) -> std::io::Result<()> {
    const WIDTH: usize = 40;
    let wrap = |text: &str| -> Vec<String> {
        let mut lines = vec![String::new()];
        for c in text.replace('\n', "⏎").chars() {
            if lines.last().is_some_and(|l| l.chars().count() >= WIDTH) {
                lines.push(String::new());
            }
            lines.last_mut().expect("starts with one line").push(c);
        }
        lines
    };
    let (a, b) = (wrap(base), wrap(other));
    print_line(&format!("{:<WIDTH$} | {}", "BASE greedy", "OTHER greedy"))?;
    for i in 0..a.len().max(b.len()) {
        let (l, r) = (a.get(i).map_or("", String::as_str), b.get(i).map_or("", String::as_str));
        let pad = WIDTH.saturating_sub(l.chars().count());
        print_line(&format!("{l}{:pad$} | {r}", ""))?;
    }
    Ok(())
}
