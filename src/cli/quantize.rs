//! `infer quantize IN OUT TYPE`: converts a model's tensors to another type (see [`crate::quantize`]).

use std::io::IsTerminal;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use anyhow::Context;
use clap::Args;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use infer_kernels::GgmlType;

use super::args::ThreadArgs;
use crate::cli::output::eprintln_lossy;
use crate::model::{KvDtype, Model};
use crate::quantize::timeline;
use crate::quantize::{
    Importance, Mode, Policy, Quantizer, Staged, TARGETS, Weighting, calibrate, parse_target, self_calibrate,
};
use crate::registry::human_size;
use crate::tokenizer::{TokenTypes, Tokenizer};

/// Type names as the command line spells them, for clap's list of possible values.
fn target_names() -> Vec<&'static str> {
    TARGETS.iter().map(|&(n, _)| n).collect()
}

fn parse_max_kld(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(x) if x.is_finite() && x >= 0.0 => Ok(x),
        _ => Err(format!("'{s}' is not a KL divergence: expected a number of nats, 0 or more (e.g. 0.05)")),
    }
}

fn parse_type(s: &str) -> Result<GgmlType, String> {
    parse_target(s).ok_or_else(|| format!("unknown type '{s}' (expected one of: {})", target_names().join(", ")))
}

#[derive(Args, Debug)]
pub struct QuantizeArgs {
    /// The model to convert: a GGUF file (F32, F16 or BF16; a quantized one with --allow-requantize) or a registry
    /// name.
    #[arg(value_name = "IN")]
    pub input: String,
    /// Where to write the result (written to a temporary file beside it, then renamed).
    #[arg(value_name = "OUT")]
    pub output: PathBuf,
    /// Tensor type: f32, f16, bf16, q8_0, q6_k, q5_0, q4_1, q4_0, q4_k or q2_k.
    #[arg(value_name = "TYPE", value_parser = parse_type)]
    pub target: GgmlType,
    /// Give every 2-D tensor TYPE, as llama-quantize --pure (by default the output projection keeps Q8_0).
    #[arg(long)]
    pub pure: bool,
    /// Round each block to the nearest level of a scale taken from its extremes: llama-quantize's exact bytes.
    /// The default searches each block's scale (and minimum) for the least squared error, weighted by each column's
    /// importance: from --calibrate's text, or else from a run of the model over 47 pseudo-random tokens.
    #[arg(long, conflicts_with = "calibrate")]
    pub rtn: bool,
    /// Run the model over this text first and weight each column's error by the mean square of its inputs
    /// (what llama-imatrix measures).
    #[arg(long, value_name = "TEXT_FILE")]
    pub calibrate: Option<PathBuf>,
    /// Context size of the calibration chunks.
    #[arg(long, value_name = "N", default_value_t = 512, value_parser = clap::value_parser!(u32).range(8..=65536))]
    pub calibrate_ctx: u32,
    /// Calibrate on at most this many chunks.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    pub calibrate_chunks: Option<u32>,
    /// With --calibrate, round Q4_0 without error feedback: each weight to its nearest level, as without
    /// --calibrate (by default each row's rounding errors are spread over its later columns, GPTQ-style, using the
    /// calibration inputs' correlations).
    #[arg(long, requires = "calibrate")]
    pub no_error_feedback: bool,
    /// Accept quantized input: its tensors are dequantized to f32 first.
    #[arg(long)]
    pub allow_requantize: bool,
    /// Type of the token embedding (token_embd.weight), whatever the policy says.
    #[arg(long, value_name = "TYPE", value_parser = parse_type)]
    pub token_embedding_type: Option<GgmlType>,
    /// Type of the output projection (output.weight, or the token embedding when the model ties them).
    #[arg(long, value_name = "TYPE", value_parser = parse_type)]
    pub output_tensor_type: Option<GgmlType>,
    /// Print a line per tensor.
    #[arg(short, long)]
    pub verbose: bool,
    /// Print the plan (every tensor's type and size, the totals and bits per weight) and write nothing.
    #[arg(long, conflicts_with_all = ["check", "check_text", "max_kld", "calibrate"])]
    pub dry_run: bool,
    /// After writing, score OUT against IN on a text: mean and 99th-percentile KL divergence of the next-token
    /// distributions, how often the top token agrees, both perplexities (the text is a built-in one of ~650
    /// tokens of varied kinds unless --check-text names one).
    #[arg(long)]
    pub check: bool,
    /// The text --check scores (its first 1,024 tokens); implies --check.
    #[arg(long, value_name = "TEXT_FILE")]
    pub check_text: Option<PathBuf>,
    /// Fail (exit status 1; OUT is kept) when --check's mean KL divergence is above this many nats; implies
    /// --check. For scale, on the built-in text SmolLM2's Q8_0 gives 0.001 and Q4_0 0.17.
    #[arg(long, value_name = "NATS", value_parser = parse_max_kld, allow_negative_numbers = true)]
    pub max_kld: Option<f64>,
    #[command(flatten)]
    pub threads: ThreadArgs,
}

pub fn run(args: QuantizeArgs) -> anyhow::Result<()> {
    timeline::start();
    let input = super::resolve_model_arg(Some(&args.input))?;
    let policy = Policy {
        target: args.target,
        pure: args.pure,
        token_embedding: args.token_embedding_type,
        output: args.output_tensor_type,
    };
    let mode = if args.rtn { Mode::Rtn } else { Mode::Search };
    // The check's text is read first, so that a wrong path fails before minutes of quantizing.
    let check_text = match &args.check_text {
        Some(path) => Some(super::perplexity::read_text(path)?),
        None if args.check || args.max_kld.is_some() => Some(crate::quantize::check::BUILT_IN_TEXT.to_string()),
        None => None,
    };
    let quantizer = Quantizer::open(&input, &args.output, &policy, mode, args.allow_requantize)?;
    timeline::mark!("opened input");
    if args.dry_run {
        return print_plan(&quantizer, &args);
    }
    let cancel = Arc::new(AtomicBool::new(false));
    {
        let cancel = cancel.clone();
        // Ctrl-C stops at the next row range; the temporary file is removed on the way out. (Installed before the
        // file is created, so that no signal finds it there without this handler.)
        let _ = ctrlc::set_handler(move || cancel.store(true, Ordering::SeqCst));
    }
    let output = quantizer.create_output(&args.output)?;
    timeline::mark!("opened input, created output");

    let file = quantizer.input();
    let in_type = file.metadata().get("general.file_type").and_then(crate::gguf::MetaValue::as_u64);
    eprintln_lossy!(
        "quantizing {} ({}, {}) to {} as {}{}",
        input.display(),
        in_type.and_then(super::info::file_type_name).unwrap_or("?"),
        human_size(file.file_len()),
        args.output.display(),
        args.target,
        match (mode, &args.calibrate) {
            (Mode::Rtn, _) => ", rounding to nearest",
            (Mode::Search, None) => ", searching block scales weighted by a self-calibration",
            (Mode::Search, Some(_)) => ", searching block scales weighted by calibration",
        }
    );
    let requant = quantizer.requantized_types();
    if !requant.is_empty() {
        let names: Vec<_> = requant.iter().map(|t| t.name()).collect();
        eprintln_lossy!("note: dequantizing the {} tensors to f32 first (--allow-requantize)", names.join(", "));
    }
    let fallbacks = quantizer.fallbacks();
    if !fallbacks.is_empty() {
        let n: usize = fallbacks.iter().map(|f| f.2).sum();
        let groups: Vec<String> = fallbacks.iter().map(|(w, t, c)| format!("{c} {w} -> {t}")).collect();
        eprintln_lossy!(
            "warning: {n} of {} tensors have rows that are not a whole number of their type's blocks and fall back: {}",
            quantizer.plan().len(),
            groups.join(", ")
        );
    }

    let pool = args.threads.build_pool().context("starting worker threads")?;
    let result = (|| -> anyhow::Result<()> {
        let gathered = match &args.calibrate {
            Some(path) => Some(pool.install(|| run_calibration(path, &args, &quantizer, &cancel))?),
            None => None,
        };
        // Without a text, the self-calibration's forward pass runs beside the quantizer, which takes each layer's
        // matrices as soon as the pass has left that layer.
        let staged = (gathered.is_none() && mode == Mode::Search && quantizer.searches())
            .then(|| Arc::new(Staged::new(quantizer.input())));
        let weighting = match (&gathered, &staged) {
            (Some(g), _) => Weighting::Gathered(g),
            (None, Some(s)) => Weighting::Staged(s),
            (None, None) => Weighting::Norms,
        };
        let total = quantizer.plan().len() as u64;
        let bar = progress_bar(total);
        bar.set_message("tensors");
        let verbose = args.verbose;
        let tensor_bar = bar.clone();
        let mut on_tensor = move |t: &crate::quantize::TensorDone| {
            if verbose {
                let line = tensor_line(t.index, t.total, t.plan, t.bytes_in, t.bytes_out, Some(t.elapsed));
                tensor_bar.suspend(|| eprintln_lossy!("{line}"));
            }
            tensor_bar.inc(1);
        };
        let result = std::thread::scope(|scope| {
            if let Some(staged) = &staged {
                let (pool, quantizer, cancel, bar) = (&pool, &quantizer, &cancel, bar.clone());
                scope.spawn(move || {
                    // Whatever happens here (even a panic), the quantizer must stop waiting.
                    let _end = EndOnDrop(staged);
                    if let Err(e) = self_calibration(pool, quantizer, cancel, staged.clone()) {
                        bar.suspend(|| {
                            eprintln_lossy!(
                                "note: no self-calibration ({e:#}); weighting columns by the norms before them"
                            )
                        });
                    }
                });
            }
            quantizer.run(&pool, output, weighting, &cancel, &mut on_tensor)
        });
        bar.finish_and_clear();
        let s = result?;
        eprintln_lossy!(
            "done: {} ({:.2} bits per weight) -> {} ({:.2} bits per weight) in {:.2} s",
            human_size(s.file_bytes_in),
            s.bpw_in(),
            human_size(s.file_bytes_out),
            s.bpw_out(),
            s.elapsed.as_secs_f64()
        );
        Ok(())
    })();
    timeline::mark!("dropping the input");
    drop(quantizer);
    timeline::mark!("input dropped");
    match result {
        // Whatever step noticed the Ctrl-C, the temporary output is gone: status 130, as the other commands.
        Err(_) if cancel.load(Ordering::SeqCst) => {
            eprintln_lossy!("note: no output was written");
            Err(super::Interrupted.into())
        }
        Ok(()) => match check_text {
            Some(text) => pool.install(|| check_output(&input, &args, &text)),
            None => Ok(()),
        },
        r => r,
    }
}

/// `--dry-run`: the plan, one line per tensor as `-v` prints them, and the sizes before and after.
fn print_plan(quantizer: &Quantizer, args: &QuantizeArgs) -> anyhow::Result<()> {
    let file = quantizer.input();
    let plan = quantizer.plan();
    let (mut bytes_in, mut bytes_out, mut elements) = (0u64, 0u64, 0u64);
    let mut out = String::new();
    for (i, p) in plan.iter().enumerate() {
        let tensor = &file.tensors()[p.index];
        let rows = p.dims.iter().skip(1).product::<u64>();
        let size = p.dims.first().and_then(|&w| p.to.row_bytes(w)).and_then(|r| r.checked_mul(rows));
        let size = size.with_context(|| format!("tensor {}: {:?} does not fit {}", p.name, p.dims, p.to))?;
        bytes_in += tensor.n_bytes;
        bytes_out += size;
        elements += p.dims.iter().product::<u64>();
        out.push_str(&tensor_line(i, plan.len(), p, tensor.n_bytes, size, None));
        out.push('\n');
    }
    let bpw = |b: u64| crate::quantize::bits_per_weight(b, elements);
    out.push_str(&format!(
        "dry run: {} tensors, {} ({:.2} bits per weight) -> {} ({:.2} bits per weight) as {}; nothing written to {}\n",
        plan.len(),
        human_size(bytes_in),
        bpw(bytes_in),
        human_size(bytes_out),
        bpw(bytes_out),
        args.target,
        args.output.display()
    ));
    crate::cli::output::print_flush(&out)?;
    Ok(())
}

/// One tensor's line of `-v` (with the time it took) and of `--dry-run` (without): position, name, shape, types
/// and sizes before and after, and the type it fell back from.
fn tensor_line(
    index: usize,
    total: usize,
    p: &crate::quantize::TensorPlan,
    bytes_in: u64,
    bytes_out: u64,
    elapsed: Option<std::time::Duration>,
) -> String {
    let dims: Vec<String> = p.dims.iter().map(u64::to_string).collect();
    format!(
        "[{:>4}/{}] {:<28} {:>12} {:>5} -> {:<5} {:>9} -> {:>9}{}{}",
        index + 1,
        total,
        p.name,
        dims.join("x"),
        p.from.name(),
        p.to.name(),
        human_size(bytes_in),
        human_size(bytes_out),
        elapsed.map_or_else(String::new, |e| format!(" {:>6.0} ms", e.as_secs_f64() * 1e3)),
        if p.fell_back() { format!(" (fallback from {})", p.wanted) } else { String::new() }
    )
}

/// `--check`: OUT scored against IN on the check text, both with an f32 KV cache so that only the weights differ,
/// and `--max-kld` enforced.
fn check_output(input: &std::path::Path, args: &QuantizeArgs, text: &str) -> anyhow::Result<()> {
    let what = match &args.check_text {
        Some(path) => path.display().to_string(),
        None => "the built-in text".to_string(),
    };
    let engine = super::EngineArgs::default();
    // OUT is in place by now: a failure here says so, so that nobody takes it for a failed conversion.
    let unchecked =
        || format!("{} was written, but checking it against {} failed", args.output.display(), input.display());
    let base = super::load(Some(&input.to_string_lossy()), &engine).with_context(unchecked)?;
    let other = super::load_model(Some(&args.output.to_string_lossy()), &engine).with_context(unchecked)?.1;
    let report = crate::quantize::check::check(&base.model, &other, &base.tokenizer, text, KvDtype::F32)
        .with_context(unchecked)?;
    let d = &report.divergence;
    let (Some(kld), Some(p99), Some(top1), Some(ppl_in), Some(ppl_out), Some(dp)) =
        (d.kld_mean, d.kld_p99, d.top1_agreement, d.ppl_base, d.ppl_other, d.delta_p_mean)
    else {
        anyhow::bail!(
            "the check text {what} is too short: it gave {} tokens, and at least 2 are needed",
            report.tokens
        );
    };
    eprintln_lossy!(
        "check on {what} ({} positions): mean KLD {kld:.4}, 99% KLD {p99:.3}, same top token {:.1}%, mean Δp {:+.2}%, \
         PPL {ppl_out:.3} against {ppl_in:.3} (×{:.3})",
        d.positions,
        top1 * 100.0,
        dp * 100.0,
        ppl_out / ppl_in,
    );
    if let Some(max) = args.max_kld
        && kld > max
    {
        anyhow::bail!(
            "the check failed: mean KLD {kld:.4} is above --max-kld {max}; {} was written and kept",
            args.output.display()
        );
    }
    Ok(())
}

/// The input as a model, on the quantizer's mapping of it. With `panels` false the matrices stay in the file's
/// layout: the self-calibration's 47 tokens would not pay for repacking (on an F32 input, the whole model), and
/// repacking releases map pages that the quantizer then faults back in.
fn load_model(quantizer: &Quantizer, panels: bool) -> anyhow::Result<Model> {
    infer_kernels::dispatch::try_isa().context("INFER_ISA")?;
    let file = quantizer.shared_input();
    let path = file.path().display().to_string();
    let build = if panels { Model::from_file } else { Model::from_file_unpacked };
    let mut model = build(file).with_context(|| format!("loading {path}"))?;
    model.set_precision(super::EngineArgs::default().precision());
    timeline::mark!("model loaded");
    Ok(model)
}

/// Runs IN over pseudo-random tokens of its vocabulary for the columns' importance, handing each layer's to
/// `staged` as the pass leaves it. If IN cannot run here, the caller says so and the search goes on without (it
/// then weighs columns by the preceding norms).
///
/// The model loads on `pool`, then the forward pass runs on a pool of its own with half the threads (at least
/// one), beside `pool`'s quantizing. In `pool` itself the pass's team of threads (see `parallel::with_team`) would
/// wait on the quantizer's tasks between its regions: perf put ~7% of the run's CPU time in `sched_yield` there.
fn self_calibration(
    pool: &rayon::ThreadPool,
    quantizer: &Quantizer,
    cancel: &AtomicBool,
    staged: Arc<Staged>,
) -> anyhow::Result<()> {
    // Drawing tokens needs only their types, not a tokenizer (whose BPE merge table took longer to build than the
    // model to load, and the pass waited for both).
    let vocab = TokenTypes::from_metadata(quantizer.input().metadata())
        .with_context(|| format!("reading the vocabulary of {}", quantizer.input().path().display()))?;
    let model = pool.install(|| load_model(quantizer, false))?;
    let threads = (pool.current_num_threads() / 2).max(1);
    let own = rayon::ThreadPoolBuilder::new().num_threads(threads).build().context("starting worker threads")?;
    own.install(|| self_calibrate(&model, &vocab, cancel, staged))?;
    timeline::mark!("calibration returned");
    Ok(())
}

/// Ends a [`Staged`] calibration when dropped.
struct EndOnDrop<'a>(&'a Staged);

impl Drop for EndOnDrop<'_> {
    fn drop(&mut self) {
        self.0.end();
    }
}

/// Loads IN as a model and gathers its columns' importance over the text in `path`.
fn run_calibration(
    path: &std::path::Path,
    args: &QuantizeArgs,
    quantizer: &Quantizer,
    cancel: &AtomicBool,
) -> anyhow::Result<Importance> {
    let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let (model, tokenizer) = rayon::join(|| load_model(quantizer, true), || Tokenizer::from_gguf(quantizer.input()));
    let model = model.context("--calibrate runs the input model, which must load")?;
    let tokenizer =
        tokenizer.with_context(|| format!("loading the tokenizer of {}", quantizer.input().path().display()))?;
    let bar = progress_bar(0);
    bar.set_message("calibration chunks");
    let mut on_chunk = |done: usize, total: usize| {
        bar.set_length(total as u64);
        bar.set_position(done as u64);
    };
    // The Gram matrices cost time and memory (width² per input): only for the error feedback of Q4_0.
    let gram = !args.no_error_feedback && quantizer.plan().iter().any(|p| p.to == GgmlType::Q4_0 && p.from != p.to);
    let importance = calibrate(
        &model,
        &tokenizer,
        &text,
        args.calibrate_ctx as usize,
        args.calibrate_chunks.map(|c| c as usize),
        gram,
        cancel,
        &mut on_chunk,
    )
    .with_context(|| format!("calibrating on {}", path.display()))?;
    bar.finish_and_clear();
    eprintln_lossy!(
        "calibrated on {} ({} tokens): importance for {} tensors{}",
        path.display(),
        importance.tokens,
        importance.len(),
        if gram { ", error feedback for the Q4_0 ones" } else { "" }
    );
    Ok(importance)
}

fn progress_bar(len: u64) -> ProgressBar {
    if !std::io::stderr().is_terminal() {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::with_draw_target(Some(len), ProgressDrawTarget::stderr());
    if let Ok(style) = ProgressStyle::with_template("{msg} [{bar:30}] {pos}/{len}, eta {eta}") {
        bar.set_style(style.progress_chars("=> "));
    }
    bar
}
