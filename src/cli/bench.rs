//! `infer bench [MODEL...]`: speed of prefill (`pp<N>`), single-sequence decode (`tg<N>`) and batched decode (the
//! `--batch` curve), in the style of llama-bench and llama-batched-bench.
//!
//! Token ids are random (seeded): tokenization and sampling are not part of what is timed, and neither is choosing
//! the next token. Every test runs once untimed (warmup), then `-r` timed repetitions; rates are reported as the mean
//! ± the sample standard deviation of the per-repetition rates.
//!
//! - `pp<N>`: one prompt of N tokens through an empty cache, in forward calls of at most `--ubatch` tokens.
//! - `tg<N>`: N single-token forward calls from an empty cache, each computing the logits of its token.
//! - `-d D` (depth, as llama-bench has it): `pp<N> @ d<D>` and `tg<N> @ d<D>` run the same after an untimed prefill
//!   of D random tokens, so they measure attention over a cache of D positions.
//! - `--batch B,...`: B independent sequences, each with its own KV table in one shared paged pool. Their prompts are
//!   prefilled together in one forward call, then every decode step is one forward call over all B sequences, one
//!   token each. S_PP = B·PP/T_PP and S_TG = B·TG/T_TG are aggregate rates.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{Context, bail};
use clap::Args;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::Serialize;

use crate::cli::args::{parse_count, parse_threads};
use crate::cli::info::file_type_name;
use crate::cli::output::{print_line, stderr_is_terminal};
use crate::gguf::MetaValue;
use crate::model::{ForwardScratch, KvDtype, KvPool, Logits, Model, SeqKv, SeqStep};

use super::EngineArgs;

#[derive(Args, Debug)]
pub struct BenchArgs {
    /// Models to test: .gguf paths or registry names [default: the registry's default model].
    #[arg(value_name = "MODEL")]
    pub models: Vec<String>,
    /// Prompt lengths for the prefill tests pp<N>, comma-separated; 0 = none [default: 512, or none with --batch].
    #[arg(short = 'p', long = "n-prompt", value_name = "N,..", value_delimiter = ',', value_parser = parse_length,
          allow_negative_numbers = true)]
    pub n_prompt: Vec<usize>,
    /// Token counts for the generation tests tg<N>, comma-separated; 0 = none [default: 128, or none with --batch].
    #[arg(short = 'n', long = "n-gen", value_name = "N,..", value_delimiter = ',', value_parser = parse_length,
          allow_negative_numbers = true)]
    pub n_gen: Vec<usize>,
    /// Cached positions before each pp/tg test, comma-separated (llama-bench's -d): the test runs after that many
    /// tokens of an untimed prefill.
    #[arg(short = 'd', long = "n-depth", value_name = "N,..", value_delimiter = ',', default_value = "0",
          value_parser = parse_length, allow_negative_numbers = true)]
    pub n_depth: Vec<usize>,
    /// Timed repetitions of every test (after one untimed warmup run).
    #[arg(short = 'r', long = "repetitions", value_name = "N", default_value_t = 5, value_parser = parse_repetitions,
          allow_negative_numbers = true)]
    pub repetitions: usize,
    /// Thread counts to test, comma-separated [default: all available cores].
    #[arg(short = 't', long = "threads", value_name = "N,..", value_delimiter = ',', value_parser = parse_threads,
          allow_negative_numbers = true)]
    pub threads: Vec<std::num::NonZeroUsize>,
    /// Output format: a markdown table, one JSON array, JSON lines, or CSV (to stdout).
    #[arg(short = 'o', long = "output", value_name = "FMT", default_value = "md",
          value_parser = ["md", "json", "jsonl", "csv"])]
    pub output: String,
    /// The batching curve: numbers of parallel sequences, comma-separated (like llama-batched-bench's -npl).
    #[arg(long = "batch", value_name = "B,..", value_delimiter = ',', value_parser = parse_batch,
          allow_negative_numbers = true, help_heading = "Batching curve")]
    pub batch: Vec<usize>,
    /// Prompt tokens per sequence in the batching curve, comma-separated.
    #[arg(long = "batch-prompt", value_name = "N,..", value_delimiter = ',', default_value = "16",
          value_parser = parse_length, allow_negative_numbers = true, help_heading = "Batching curve")]
    pub batch_prompt: Vec<usize>,
    /// Generated tokens per sequence in the batching curve, comma-separated (at least 1).
    #[arg(long = "batch-gen", value_name = "N,..", value_delimiter = ',', default_value = "24",
          value_parser = parse_batch_gen, allow_negative_numbers = true, help_heading = "Batching curve")]
    pub batch_gen: Vec<usize>,
    /// Most prompt tokens per forward call in the pp tests (longer prompts run in chunks).
    #[arg(long = "ubatch", value_name = "N", default_value_t = 512, value_parser = parse_ubatch,
          allow_negative_numbers = true)]
    pub ubatch: usize,
    /// Skip the untimed warmup run of each test.
    #[arg(long)]
    pub no_warmup: bool,
    /// Also draw the results as a chart: FILE.svg or FILE.png.
    #[arg(long, value_name = "FILE")]
    pub plot: Option<PathBuf>,
    #[command(flatten)]
    pub engine: EngineArgs,
}

/// `-p`, `-n`, `--batch-prompt`: a whole number ≥ 0.
fn parse_length(text: &str) -> Result<usize, String> {
    parse_count(text).map_err(|_| format!("'{text}' is not a token count: expected a whole number >= 0 (0 = none)"))
}

fn parse_at_least_one(text: &str, what: &str) -> Result<usize, String> {
    match parse_count(text) {
        Ok(0) => Err(format!("{what} must be at least 1")),
        Ok(n) => Ok(n),
        Err(_) => Err(format!("'{text}' is not a valid {what}: expected a whole number >= 1")),
    }
}

fn parse_repetitions(text: &str) -> Result<usize, String> {
    parse_at_least_one(text, "repetition count")
}

fn parse_batch(text: &str) -> Result<usize, String> {
    parse_at_least_one(text, "batch size (number of sequences)")
}

fn parse_batch_gen(text: &str) -> Result<usize, String> {
    parse_at_least_one(text, "generated token count")
}

fn parse_ubatch(text: &str) -> Result<usize, String> {
    parse_at_least_one(text, "micro-batch size")
}

/// Seed of the random token ids: fixed, so every run feeds the same tokens.
const TOKEN_SEED: u64 = 0x1B_E4C4;

/// What one model is, for the report.
#[derive(Debug, Clone)]
struct ModelInfo {
    filename: String,
    /// "llama 135M Q4_1": architecture, size class, file type.
    model_type: String,
    /// Bytes of tensor data (as llama-bench's model_size).
    size: u64,
    n_params: u64,
    n_ctx: usize,
}

impl ModelInfo {
    fn of(path: &Path, model: &Model) -> ModelInfo {
        let file = model.file();
        let meta = file.metadata();
        let ftype = match meta.get("general.file_type").and_then(MetaValue::as_u64) {
            Some(ft) => file_type_name(ft).map(str::to_string).unwrap_or_else(|| format!("ftype {ft}")),
            None => dominant_type(model),
        };
        let n_params = file.parameter_count();
        ModelInfo {
            filename: path.display().to_string(),
            model_type: format!("{} {} {}", model.config.arch.name(), size_class(n_params), ftype),
            size: file.tensor_bytes_total(),
            n_params,
            n_ctx: model.config.n_ctx_train,
        }
    }
}

/// The ggml type holding most of the tensor bytes (for files without `general.file_type`).
fn dominant_type(model: &Model) -> String {
    let mut by_type: Vec<(String, u64)> = Vec::new();
    for t in model.file().tensors() {
        let name = t.ty.to_string();
        match by_type.iter_mut().find(|(n, _)| *n == name) {
            Some(entry) => entry.1 += t.n_bytes,
            None => by_type.push((name, t.n_bytes)),
        }
    }
    by_type.into_iter().max_by_key(|(_, b)| *b).map_or_else(|| "unknown".into(), |(n, _)| n)
}

/// "135M", "1.7B": the rounded parameter count models are named by.
fn size_class(n: u64) -> String {
    let n = n as f64;
    if n >= 1e9 {
        format!("{:.1}B", n / 1e9)
    } else if n >= 1e6 {
        format!("{:.0}M", n / 1e6)
    } else if n >= 1e3 {
        format!("{:.0}K", n / 1e3)
    } else {
        format!("{n}")
    }
}

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
fn mean_sd(xs: &[f64]) -> (f64, f64) {
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

/// One test to run on a model at a thread count. Prompt and Gen carry (tokens, depth): the positions already
/// cached when the timed part starts.
#[derive(Debug, Clone, Copy)]
enum Test {
    Prompt(usize, usize),
    Gen(usize, usize),
    Curve { batch: usize, prompt: usize, gen_len: usize },
}

impl Test {
    fn name(self) -> String {
        match self {
            Test::Prompt(n, 0) => format!("pp{n}"),
            Test::Gen(n, 0) => format!("tg{n}"),
            // llama-bench's spelling.
            Test::Prompt(n, d) => format!("pp{n} @ d{d}"),
            Test::Gen(n, d) => format!("tg{n} @ d{d}"),
            Test::Curve { batch, prompt, gen_len } => format!("pp{prompt}+tg{gen_len} x{batch}"),
        }
    }

    /// Positions one sequence of this test needs.
    fn positions(self) -> usize {
        match self {
            Test::Prompt(n, depth) | Test::Gen(n, depth) => depth.saturating_add(n),
            Test::Curve { prompt, gen_len, .. } => prompt.saturating_add(gen_len),
        }
    }

    /// Sequences the test decodes at once.
    fn sequences(self) -> usize {
        match self {
            Test::Curve { batch, .. } => batch,
            _ => 1,
        }
    }
}

/// Positions of a pool for `n_seq` sequences of `positions` each, rounded up to whole blocks.
fn pool_capacity(n_seq: usize, positions: usize) -> Option<usize> {
    n_seq.checked_mul(positions.max(1).checked_next_multiple_of(crate::model::kv_cache::DEFAULT_BLOCK_SIZE)?)
}

/// Refuses, before anything is measured, a test whose KV cache would not fit in memory.
fn check_pool_fits(model: &Model, kv_dtype: KvDtype, test: Test) -> anyhow::Result<()> {
    let cap = pool_capacity(test.sequences(), test.positions());
    let bytes = cap.and_then(|c| KvPool::bytes_for(&model.config, kv_dtype, c, c, 0));
    crate::memory::check_fits(&format!("the KV cache of {}", test.name()), bytes, "use fewer positions or sequences")?;
    Ok(())
}

/// Timings of one repetition.
#[derive(Debug, Clone, Copy)]
struct Sample {
    /// Prefill seconds (pp tests and the curve's prompt phase).
    pp: f64,
    /// Generation seconds.
    tg: f64,
    /// CPU seconds of all the process's threads during the prefill and the generation (None where unknown).
    cpu_pp: Option<f64>,
    cpu_tg: Option<f64>,
}

/// CPU time used so far by all threads of this process, in seconds (Linux: the sum of
/// `/proc/self/task/*/schedstat`; a running thread's figure can lag by a scheduler tick, a few ms, so it means
/// something for phases of 100 ms and more). On a busy machine the wall clock counts time the threads
/// spent waiting for a core; CPU time does not, so `tokens / (cpu / threads)` estimates the rate on an idle machine.
fn process_cpu_seconds() -> Option<f64> {
    let mut total_ns: u64 = 0;
    for entry in std::fs::read_dir("/proc/self/task").ok()? {
        let path = entry.ok()?.path().join("schedstat");
        // A thread may exit between listing and reading: skip it.
        let Ok(text) = std::fs::read_to_string(path) else { continue };
        total_ns += text.split_whitespace().next()?.parse::<u64>().ok()?;
    }
    Some(total_ns as f64 * 1e-9)
}

/// Wall-clock and CPU time of one timed phase.
struct Stopwatch {
    wall: Instant,
    cpu: Option<f64>,
}

impl Stopwatch {
    fn start() -> Stopwatch {
        let cpu = process_cpu_seconds();
        Stopwatch { wall: Instant::now(), cpu }
    }

    /// (wall seconds, CPU seconds).
    fn stop(self) -> (f64, Option<f64>) {
        let wall = self.wall.elapsed().as_secs_f64();
        let cpu = match (self.cpu, process_cpu_seconds()) {
            (Some(a), Some(b)) => Some((b - a).max(0.0)),
            _ => None,
        };
        (wall, cpu)
    }
}

/// Runs tests on one model with reusable buffers.
struct Runner<'m> {
    model: &'m Model,
    scratch: ForwardScratch,
    kv_dtype: KvDtype,
    ubatch: usize,
    rng: ChaCha8Rng,
}

impl Runner<'_> {
    fn random_tokens(&mut self, n: usize) -> Vec<u32> {
        let n_vocab = self.model.config.n_vocab as u32;
        (0..n).map(|_| self.rng.random_range(0..n_vocab)).collect()
    }

    /// A pool with room for `n_seq` sequences of `positions` each (rounded up to whole blocks); its size was
    /// checked by [`check_pool_fits`].
    fn pool(&self, n_seq: usize, positions: usize) -> KvPool {
        let cap = pool_capacity(n_seq, positions).unwrap_or(usize::MAX);
        KvPool::new(&self.model.config, self.kv_dtype, cap, cap)
    }

    /// Runs `tokens` through `kv` in forward calls of at most `--ubatch` tokens; `last` is the logits request of
    /// the final call.
    fn prefill(&mut self, tokens: &[u32], last: Logits, kv: &mut SeqKv, pool: &mut KvPool) -> anyhow::Result<()> {
        let chunks = tokens.len().div_ceil(self.ubatch);
        for (i, chunk) in tokens.chunks(self.ubatch).enumerate() {
            let logits = if i + 1 == chunks { last } else { Logits::None };
            let mut items = [SeqStep { tokens: chunk, kv: &mut *kv, logits }];
            self.model.forward(&mut items, pool, &mut self.scratch)?;
        }
        Ok(())
    }

    /// The untimed prefill of a test at depth `depth` (-d): random tokens, as llama-bench does it, redone for every
    /// repetition so that each starts from the same cache (sliding-window layers cannot be truncated back).
    fn fill_depth(&mut self, depth: usize, kv: &mut SeqKv, pool: &mut KvPool) -> anyhow::Result<()> {
        let tokens = self.random_tokens(depth);
        self.prefill(&tokens, Logits::None, kv, pool).context("prefill of the -d depth")
    }

    /// Runs `test` once; `pool` was sized for it by [`Runner::pool`].
    fn run_once(&mut self, test: Test, pool: &mut KvPool) -> anyhow::Result<Sample> {
        match test {
            Test::Prompt(n, depth) => {
                let tokens = self.random_tokens(n);
                let mut kv = SeqKv::new();
                let mut result = self.fill_depth(depth, &mut kv, pool);
                let watch = Stopwatch::start();
                if result.is_ok() {
                    result = self.prefill(&tokens, Logits::Last, &mut kv, pool);
                }
                let (secs, cpu) = watch.stop();
                pool.release(&mut kv);
                result.context("prefill forward pass")?;
                Ok(Sample { pp: secs, tg: 0.0, cpu_pp: cpu, cpu_tg: None })
            }
            Test::Gen(n, depth) => {
                let tokens = self.random_tokens(n);
                let mut kv = SeqKv::new();
                let mut result = self.fill_depth(depth, &mut kv, pool);
                let watch = Stopwatch::start();
                for t in tokens.chunks(1) {
                    if result.is_err() {
                        break;
                    }
                    let mut items = [SeqStep { tokens: t, kv: &mut kv, logits: Logits::Last }];
                    result = self.model.forward(&mut items, pool, &mut self.scratch).map_err(Into::into);
                }
                let (secs, cpu) = watch.stop();
                pool.release(&mut kv);
                result.context("decode forward pass")?;
                Ok(Sample { pp: 0.0, tg: secs, cpu_pp: None, cpu_tg: cpu })
            }
            Test::Curve { batch, prompt, gen_len } => {
                let prompts: Vec<Vec<u32>> = (0..batch).map(|_| self.random_tokens(prompt)).collect();
                let gens: Vec<Vec<u32>> = (0..batch).map(|_| self.random_tokens(gen_len)).collect();
                let mut kvs: Vec<SeqKv> = (0..batch).map(|_| SeqKv::new()).collect();
                let result = self.curve_once(&prompts, &gens, &mut kvs, pool);
                for kv in &mut kvs {
                    pool.release(kv);
                }
                result
            }
        }
    }

    fn curve_once(
        &mut self,
        prompts: &[Vec<u32>],
        gens: &[Vec<u32>],
        kvs: &mut [SeqKv],
        pool: &mut KvPool,
    ) -> anyhow::Result<Sample> {
        let (mut pp, mut cpu_pp) = (0.0, None);
        if prompts.iter().any(|p| !p.is_empty()) {
            let mut items: Vec<SeqStep> = prompts
                .iter()
                .zip(kvs.iter_mut())
                .map(|(p, kv)| SeqStep { tokens: p, kv, logits: Logits::Last })
                .collect();
            let watch = Stopwatch::start();
            self.model.forward(&mut items, pool, &mut self.scratch).context("batched prefill forward pass")?;
            (pp, cpu_pp) = watch.stop();
        }
        let steps = gens.first().map_or(0, Vec::len);
        let watch = Stopwatch::start();
        for step in 0..steps {
            let mut items: Vec<SeqStep> = gens
                .iter()
                .zip(kvs.iter_mut())
                .map(|(g, kv)| SeqStep { tokens: &g[step..step + 1], kv, logits: Logits::Last })
                .collect();
            self.model.forward(&mut items, pool, &mut self.scratch).context("batched decode forward pass")?;
        }
        let (tg, cpu_tg) = watch.stop();
        Ok(Sample { pp, tg, cpu_pp, cpu_tg })
    }
}

pub fn run(args: BenchArgs) -> anyhow::Result<()> {
    // The test plan, checked before anything is loaded.
    let with_curve = !args.batch.is_empty();
    let pick = |given: &[usize], default: usize| -> Vec<usize> {
        if given.is_empty() {
            if with_curve { Vec::new() } else { vec![default] }
        } else {
            given.iter().copied().filter(|&n| n > 0).collect()
        }
    };
    let mut tests: Vec<Test> = Vec::new();
    for &depth in &args.n_depth {
        tests.extend(pick(&args.n_prompt, 512).into_iter().map(|n| Test::Prompt(n, depth)));
        tests.extend(pick(&args.n_gen, 128).into_iter().map(|n| Test::Gen(n, depth)));
    }
    for &prompt in &args.batch_prompt {
        for &gen_len in &args.batch_gen {
            for &batch in &args.batch {
                tests.push(Test::Curve { batch, prompt, gen_len });
            }
        }
    }
    // A value given twice (`-p 64,64`) runs once.
    let mut seen = Vec::new();
    tests.retain(|t| {
        let name = t.name();
        let fresh = !seen.contains(&name);
        seen.push(name);
        fresh
    });
    if tests.is_empty() {
        bail!("nothing to run: -p and -n are both 0 and no --batch was given");
    }
    let mut threads: Vec<usize> = if args.threads.is_empty() {
        vec![std::thread::available_parallelism().map_or(1, |n| n.get())]
    } else {
        args.threads.iter().map(|n| n.get()).collect()
    };
    let mut seen_threads = Vec::new();
    threads.retain(|&n| {
        let fresh = !seen_threads.contains(&n);
        seen_threads.push(n);
        fresh
    });
    let plot = match &args.plot {
        Some(path) => Some(check_plot_path(path)?),
        None => None,
    };
    let isa = infer_kernels::dispatch::try_isa().map_err(|e| anyhow::anyhow!("{e}"))?.to_string();

    // Models: resolve every name first so that a typo in the last one fails before minutes of measuring.
    let specs: Vec<Option<&str>> =
        if args.models.is_empty() { vec![None] } else { args.models.iter().map(|s| Some(s.as_str())).collect() };
    let mut paths = Vec::new();
    for spec in &specs {
        paths.push(crate::registry::resolve_model(*spec)?);
    }
    let mut models = Vec::new();
    for path in &paths {
        let model = crate::cli::load_model_at(path, &args.engine)?;
        let info = ModelInfo::of(path, &model);
        for &test in &tests {
            check_pool_fits(&model, args.engine.kv_dtype(), test)?;
            if test.positions() > info.n_ctx {
                let what = match test {
                    Test::Prompt(n, 0) => format!("-p {n}"),
                    Test::Gen(n, 0) => format!("-n {n}"),
                    Test::Prompt(n, d) => format!("-p {n} at -d {d}"),
                    Test::Gen(n, d) => format!("-n {n} at -d {d}"),
                    Test::Curve { prompt, gen_len, .. } => {
                        format!("--batch-prompt {prompt} plus --batch-gen {gen_len}")
                    }
                };
                bail!(
                    "{what} needs {} positions, more than the context of {} ({} tokens)",
                    test.positions(),
                    info.filename,
                    info.n_ctx
                );
            }
        }
        models.push((model, info));
    }

    let pools: Vec<(usize, rayon::ThreadPool)> = threads
        .iter()
        .map(|&n| {
            rayon::ThreadPoolBuilder::new()
                .num_threads(n)
                .thread_name(|i| format!("infer-bench-{i}"))
                .build()
                .map(|p| (n, p))
                .context("starting worker threads")
        })
        .collect::<anyhow::Result<_>>()?;

    let runs_per_test = args.repetitions + usize::from(!args.no_warmup);
    let total = (models.len() * pools.len() * tests.len() * runs_per_test) as u64;
    let progress = if stderr_is_terminal() {
        let bar = ProgressBar::with_draw_target(Some(total), ProgressDrawTarget::stderr());
        bar.enable_steady_tick(std::time::Duration::from_millis(250));
        bar
    } else {
        ProgressBar::hidden()
    };
    progress.set_style(
        ProgressStyle::with_template("{spinner} [{elapsed}] {bar:30} {pos}/{len} runs  {msg}")
            .expect("valid template")
            .progress_chars("=> "),
    );

    let mut records: Vec<Record> = Vec::new();
    let build = format!("infer {}", env!("CARGO_PKG_VERSION"));
    // Ctrl-C ends the run after the repetition in progress; the tests already finished are still reported.
    let cancel = crate::cli::cancel_on_ctrl_c();
    let cancelled = || cancel.load(std::sync::atomic::Ordering::Relaxed);
    'models: for (model, info) in &models {
        let mut runner = Runner {
            model,
            scratch: ForwardScratch::new(model),
            kv_dtype: args.engine.kv_dtype(),
            ubatch: args.ubatch,
            rng: ChaCha8Rng::seed_from_u64(TOKEN_SEED),
        };
        for (n_threads, pool) in &pools {
            for &test in &tests {
                progress.set_message(format!("{} {} t{}", info.model_type, test.name(), n_threads));
                let mut kv_pool = runner.pool(test.sequences(), test.positions());
                let samples = pool.install(|| -> anyhow::Result<Vec<Sample>> {
                    let mut samples = Vec::with_capacity(args.repetitions);
                    for i in 0..runs_per_test {
                        if cancelled() {
                            break;
                        }
                        let sample = runner.run_once(test, &mut kv_pool)?;
                        if i + 1 > runs_per_test - args.repetitions {
                            samples.push(sample);
                        }
                        progress.inc(1);
                    }
                    Ok(samples)
                });
                let samples = samples.with_context(|| format!("{}: {}", info.filename, test.name()))?;
                if cancelled() {
                    break 'models;
                }
                records.push(make_record(&build, info, &isa, *n_threads, &args, test, &samples));
            }
        }
    }
    progress.finish_and_clear();
    fill_speedups(&mut records);

    let text = match args.output.as_str() {
        "json" => serde_json::to_string_pretty(&records)?,
        "jsonl" => {
            let lines: Vec<String> = records.iter().map(serde_json::to_string).collect::<Result<_, _>>()?;
            lines.join("\n")
        }
        "csv" => to_csv(&records),
        _ => to_markdown(&records, &build),
    };
    print_line(&text)?;
    if cancelled() {
        return Err(crate::cli::Interrupted.into());
    }
    if let Some((path, kind)) = plot {
        draw_plot(&path, kind, &records).with_context(|| format!("drawing {}", path.display()))?;
    }
    Ok(())
}

fn make_record(
    build: &str,
    info: &ModelInfo,
    isa: &str,
    n_threads: usize,
    args: &BenchArgs,
    test: Test,
    samples: &[Sample],
) -> Record {
    let (n_prompt, n_gen, n_depth, batch) = match test {
        Test::Prompt(n, depth) => (n, 0, depth, 1),
        Test::Gen(n, depth) => (0, n, depth, 1),
        Test::Curve { batch, prompt, gen_len } => (prompt, gen_len, 0, batch),
    };
    // The timed phase: the prefill for pp, the generation otherwise.
    let (secs, tokens): (Vec<f64>, usize) = match test {
        Test::Prompt(n, _) => (samples.iter().map(|s| s.pp).collect(), n),
        Test::Gen(n, _) => (samples.iter().map(|s| s.tg).collect(), n),
        Test::Curve { batch, gen_len, .. } => (samples.iter().map(|s| s.tg).collect(), batch * gen_len),
    };
    let rate = |t: f64, n: usize| if t > 0.0 { n as f64 / t } else { 0.0 };
    let samples_ts: Vec<f64> = secs.iter().map(|&t| rate(t, tokens)).collect();
    let samples_ns: Vec<u64> = secs.iter().map(|&t| (t * 1e9).round() as u64).collect();
    let (avg_ts, stddev_ts) = mean_sd(&samples_ts);
    let (avg_s, stddev_s) = mean_sd(&secs);
    let cpu: Option<Vec<f64>> = match test {
        Test::Prompt(..) => samples.iter().map(|s| s.cpu_pp).collect(),
        _ => samples.iter().map(|s| s.cpu_tg).collect(),
    };
    let avg_ts_cpu = cpu.as_ref().and_then(|c| {
        let mean = mean_sd(c).0;
        (mean > 0.0).then(|| tokens as f64 * n_threads as f64 / mean)
    });
    let curve = match test {
        Test::Curve { batch, prompt, gen_len } => {
            let pp_secs: Vec<f64> = samples.iter().map(|s| s.pp).collect();
            let s_pp: Vec<f64> = pp_secs.iter().map(|&t| rate(t, batch * prompt)).collect();
            let (s_pp, stddev_s_pp) = mean_sd(&s_pp);
            Some(CurvePoint {
                n_kv: batch * (prompt + gen_len),
                t_pp: mean_sd(&pp_secs).0,
                s_pp,
                stddev_s_pp,
                t_tg: avg_s,
                s_tg: avg_ts,
                stddev_s_tg: stddev_ts,
                ms_per_step: avg_s * 1e3 / gen_len as f64,
                speedup: None,
            })
        }
        _ => None,
    };
    Record {
        build: build.to_string(),
        model_filename: info.filename.clone(),
        model_type: info.model_type.clone(),
        model_size: info.size,
        model_n_params: info.n_params,
        isa: isa.to_string(),
        n_threads,
        precision: args.engine.precision.clone(),
        type_kv: args.engine.kv_type.clone(),
        n_ubatch: args.ubatch,
        test: test.name(),
        n_prompt,
        n_gen,
        n_depth,
        batch,
        avg_ns: (avg_s * 1e9).round() as u64,
        stddev_ns: (stddev_s * 1e9).round() as u64,
        avg_ts,
        stddev_ts,
        samples_ns,
        samples_ts,
        samples_cpu_ns: cpu.map(|c| c.iter().map(|&t| (t * 1e9).round() as u64).collect()),
        avg_ts_cpu,
        curve,
    }
}

/// Speed-up of each curve point over B = 1 with the same model, threads and lengths.
fn fill_speedups(records: &mut [Record]) {
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
fn md_table(header: &[&str], right: &[bool], rows: &[Vec<String>]) -> String {
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

fn to_markdown(records: &[Record], build: &str) -> String {
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
fn to_csv(records: &[Record]) -> String {
    const COLUMNS: [&str; 29] = [
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

// ---------------------------------------------------------------------------------------------------------------
// The chart.

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum PlotKind {
    Svg,
    Png,
}

/// Checks `--plot` before any measuring: a known extension, an existing folder, a font for the text.
fn check_plot_path(path: &Path) -> anyhow::Result<(PathBuf, PlotKind)> {
    let ext = path.extension().and_then(|e| e.to_str()).map(str::to_ascii_lowercase);
    let kind = match ext.as_deref() {
        Some("svg") => PlotKind::Svg,
        Some("png") => PlotKind::Png,
        _ => bail!("--plot {}: the file name must end in .svg or .png", path.display()),
    };
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty())
        && !dir.is_dir()
    {
        bail!("--plot {}: the folder {} does not exist", path.display(), dir.display());
    }
    register_font()?;
    Ok((path.to_path_buf(), kind))
}

/// TrueType fonts tried for the chart's text, in order (`INFER_PLOT_FONT` first).
const FONT_CANDIDATES: [&str; 10] = [
    "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/TTF/DejaVuSans.ttf",
    "/usr/share/fonts/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/dejavu-sans-fonts/DejaVuSans.ttf",
    "/usr/share/fonts/truetype/liberation/LiberationSans-Regular.ttf",
    "/usr/share/fonts/liberation-sans/LiberationSans-Regular.ttf",
    "/usr/share/fonts/truetype/noto/NotoSans-Regular.ttf",
    "/usr/share/fonts/noto/NotoSans-Regular.ttf",
    "/System/Library/Fonts/Supplemental/Arial.ttf",
    "C:\\Windows\\Fonts\\arial.ttf",
];

/// Finds a TrueType font and registers it as the chart's "sans-serif" (once per process).
fn register_font() -> anyhow::Result<()> {
    static DONE: std::sync::OnceLock<Result<(), String>> = std::sync::OnceLock::new();
    DONE.get_or_init(|| {
        let mut candidates: Vec<PathBuf> = Vec::new();
        if let Some(p) = std::env::var_os("INFER_PLOT_FONT") {
            candidates.push(PathBuf::from(p));
        }
        candidates.extend(FONT_CANDIDATES.iter().map(PathBuf::from));
        for dir in ["/usr/share/fonts", "/usr/local/share/fonts"] {
            find_ttf(Path::new(dir), 3, &mut candidates);
        }
        for path in &candidates {
            let Ok(bytes) = std::fs::read(path) else { continue };
            // The font must outlive every chart: leak it once.
            let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
            if plotters::style::register_font("sans-serif", plotters::style::FontStyle::Normal, bytes).is_ok() {
                return Ok(());
            }
        }
        Err("--plot needs a TrueType font for the chart's text and found none (install fonts-dejavu-core, or set \
             INFER_PLOT_FONT=/path/to/font.ttf)"
            .to_string())
    })
    .clone()
    .map_err(anyhow::Error::msg)
}

/// Adds the `.ttf` files under `dir` (to `depth` levels) to `out`.
fn find_ttf(dir: &Path, depth: usize, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    let mut entries: Vec<PathBuf> = entries.filter_map(|e| e.ok().map(|e| e.path())).collect();
    entries.sort();
    for p in entries {
        if p.is_dir() {
            if depth > 0 {
                find_ttf(&p, depth - 1, out);
            }
        } else if p.extension().is_some_and(|e| e.eq_ignore_ascii_case("ttf")) {
            out.push(p);
        }
    }
}

fn draw_plot(path: &Path, kind: PlotKind, records: &[Record]) -> anyhow::Result<()> {
    use plotters::prelude::*;
    let has_curve = records.iter().any(|r| r.curve.is_some());
    let has_plain = records.iter().any(|r| r.curve.is_none());
    let panels = 2 * usize::from(has_curve) + usize::from(has_plain);
    let size = (560 * panels as u32, 460);
    match kind {
        PlotKind::Svg => {
            let root = SVGBackend::new(path, size).into_drawing_area();
            draw_panels(&root, records, has_curve, has_plain, panels)?;
            root.present().map_err(|e| anyhow::anyhow!("{e}"))?;
        }
        PlotKind::Png => {
            let root = BitMapBackend::new(path, size).into_drawing_area();
            draw_panels(&root, records, has_curve, has_plain, panels)?;
            root.present().map_err(|e| anyhow::anyhow!("{e}"))?;
        }
    }
    Ok(())
}

fn draw_panels<DB: plotters::prelude::DrawingBackend>(
    root: &plotters::prelude::DrawingArea<DB, plotters::coord::Shift>,
    records: &[Record],
    has_curve: bool,
    has_plain: bool,
    panels: usize,
) -> anyhow::Result<()>
where
    DB::ErrorType: 'static,
{
    use plotters::prelude::*;
    use plotters::style::text_anchor::{HPos, Pos, VPos};
    let err = |e: DrawingAreaErrorKind<DB::ErrorType>| anyhow::anyhow!("{e}");
    root.fill(&WHITE).map_err(err)?;
    let areas = root.split_evenly((1, panels));
    let mut next = 0;
    if has_curve {
        // One series per model, threads, settings and lengths.
        // Per series: its label and (B, S_TG, speed-up, S_TG from CPU time or NaN) points.
        type Series = (String, Vec<(f64, f64, f64, f64)>);
        let mut series: Vec<Series> = Vec::new();
        for r in records {
            let Some(c) = &r.curve else { continue };
            let label = format!("{} t{} {} pp{}/tg{}", r.model_type, r.n_threads, r.precision, r.n_prompt, r.n_gen);
            let point = (r.batch as f64, c.s_tg, c.speedup.unwrap_or(f64::NAN), r.avg_ts_cpu.unwrap_or(f64::NAN));
            match series.iter_mut().find(|(l, _)| *l == label) {
                Some((_, pts)) => pts.push(point),
                None => series.push((label, vec![point])),
            }
        }
        let max_b = series.iter().flat_map(|(_, p)| p.iter().map(|q| q.0)).fold(1.0, f64::max);
        let max_tg = series
            .iter()
            .flat_map(|(_, p)| p.iter().flat_map(|q| [q.1, q.3]).filter(|v| v.is_finite()))
            .fold(1.0, f64::max);
        let max_su = series
            .iter()
            .flat_map(|(_, p)| p.iter().map(|q| q.2).filter(|v| v.is_finite()))
            .fold(max_b.min(4.0), f64::max);
        let x_range = (0.8f64..max_b * 1.25).log_scale();

        let mut chart = ChartBuilder::on(&areas[next])
            .caption("Batched decode: aggregate tokens/s", ("sans-serif", 20))
            .margin(12)
            .x_label_area_size(40)
            .y_label_area_size(60)
            .build_cartesian_2d(x_range.clone(), 0f64..max_tg * 1.15)
            .map_err(err)?;
        chart
            .configure_mesh()
            .x_desc("B (parallel sequences)")
            .y_desc("S_TG (tokens/s); dashed: from CPU time")
            .light_line_style(TRANSPARENT)
            .x_label_formatter(&|x| format!("{x:.0}"))
            .draw()
            .map_err(err)?;
        for (i, (label, pts)) in series.iter().enumerate() {
            let color = Palette99::pick(i).to_rgba();
            chart
                .draw_series(LineSeries::new(pts.iter().map(|p| (p.0, p.1)), color.stroke_width(2)))
                .map_err(err)?
                .label(label.as_str())
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], color.stroke_width(2)));
            chart.draw_series(pts.iter().map(|p| Circle::new((p.0, p.1), 4, color.filled()))).map_err(err)?;
            let cpu: Vec<(f64, f64)> = pts.iter().filter(|p| p.3.is_finite()).map(|p| (p.0, p.3)).collect();
            if cpu.len() > 1 {
                chart.draw_series(DashedLineSeries::new(cpu, 6, 4, color.stroke_width(1))).map_err(err)?;
            }
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperLeft)
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK)
            .label_font(("sans-serif", 13))
            .draw()
            .map_err(err)?;
        next += 1;

        let mut chart = ChartBuilder::on(&areas[next])
            .caption("Speed-up over B = 1", ("sans-serif", 20))
            .margin(12)
            .x_label_area_size(40)
            .y_label_area_size(50)
            .build_cartesian_2d(x_range, 0f64..max_su * 1.15)
            .map_err(err)?;
        chart
            .configure_mesh()
            .x_desc("B (parallel sequences)")
            .y_desc("S_TG(B) / S_TG(1)")
            .light_line_style(TRANSPARENT)
            .x_label_formatter(&|x| format!("{x:.0}"))
            .draw()
            .map_err(err)?;
        // Perfect scaling, for reference, drawn up to where it leaves the chart.
        let ideal_top = max_b.min(max_su * 1.15);
        chart
            .draw_series(DashedLineSeries::new(
                [(1.0, 1.0), (ideal_top, ideal_top)],
                6,
                4,
                BLACK.mix(0.4).stroke_width(1),
            ))
            .map_err(err)?
            .label("linear")
            .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], BLACK.mix(0.4)));
        for (i, (label, pts)) in series.iter().enumerate() {
            let color = Palette99::pick(i).to_rgba();
            let pts: Vec<(f64, f64)> = pts.iter().filter(|p| p.2.is_finite()).map(|p| (p.0, p.2)).collect();
            if pts.is_empty() {
                continue;
            }
            chart
                .draw_series(LineSeries::new(pts.iter().copied(), color.stroke_width(2)))
                .map_err(err)?
                .label(label.as_str())
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], color.stroke_width(2)));
            chart.draw_series(pts.iter().map(|&p| Circle::new(p, 4, color.filled()))).map_err(err)?;
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperLeft)
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK)
            .label_font(("sans-serif", 13))
            .draw()
            .map_err(err)?;
        next += 1;
    }
    if has_plain {
        let plain: Vec<&Record> = records.iter().filter(|r| r.curve.is_none()).collect();
        let arch_of = |r: &Record| r.model_type.split(' ').next().unwrap_or("").to_string();
        let labels: Vec<String> = plain.iter().map(|r| format!("{} {} t{}", arch_of(r), r.test, r.n_threads)).collect();
        let max_ts = plain.iter().map(|r| r.avg_ts + r.stddev_ts).fold(1.0, f64::max);
        let n = plain.len();
        let mut chart = ChartBuilder::on(&areas[next])
            .caption("Prefill (pp) and generation (tg), tokens/s", ("sans-serif", 20))
            .margin(12)
            .x_label_area_size(40)
            .y_label_area_size(60)
            .build_cartesian_2d((0..n - 1).into_segmented(), 0f64..max_ts * 1.15)
            .map_err(err)?;
        let label_of = |x: &SegmentValue<usize>| match x {
            SegmentValue::CenterOf(i) => labels.get(*i).cloned().unwrap_or_default(),
            _ => String::new(),
        };
        chart
            .configure_mesh()
            .disable_x_mesh()
            .x_labels(n)
            .x_label_formatter(&label_of)
            .x_label_style(("sans-serif", 12))
            .y_desc("tokens/s (mean, ± sd)")
            .draw()
            .map_err(err)?;
        for (i, r) in plain.iter().enumerate() {
            let color = if r.n_gen > 0 { Palette99::pick(1) } else { Palette99::pick(0) };
            let mut bar =
                Rectangle::new([(SegmentValue::Exact(i), 0.0), (SegmentValue::Exact(i + 1), r.avg_ts)], color.filled());
            bar.set_margin(0, 0, 12, 12);
            chart.draw_series([bar]).map_err(err)?;
            let mid = SegmentValue::CenterOf(i);
            if r.stddev_ts > 0.0 {
                let (lo, hi) = ((r.avg_ts - r.stddev_ts).max(0.0), r.avg_ts + r.stddev_ts);
                chart
                    .draw_series([PathElement::new(vec![(mid.clone(), lo), (mid.clone(), hi)], BLACK.stroke_width(1))])
                    .map_err(err)?;
            }
            chart
                .draw_series([Text::new(
                    format!("{:.1}", r.avg_ts),
                    (mid, r.avg_ts + r.stddev_ts + max_ts * 0.04),
                    ("sans-serif", 13).into_font().color(&BLACK).pos(Pos::new(HPos::Center, VPos::Bottom)),
                )])
                .map_err(err)?;
        }
    }
    Ok(())
}
