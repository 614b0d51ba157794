//! Running the tests on models: the pp/tg tests as direct forward calls, the batching curve on the engine.

use std::path::Path;
use std::time::Instant;

use anyhow::{Context, bail};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use infer_kernels::GgmlType;
use infer_kernels::dispatch::Isa;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::cli::info::file_type_name;
use crate::cli::output::{print_line, stderr_is_terminal};
use crate::cli::peak;
use crate::engine::{EngineConfig, KvBudget, OutputFormat, Request, Scheduler};
use crate::gguf::MetaValue;
use crate::model::kv_cache::DEFAULT_BLOCK_SIZE;
use crate::model::{ForwardScratch, KvDtype, KvPool, Logits, Model, SeqKv, SeqStep};
use crate::sampling::SamplingParams;
use crate::tokenizer::Tokenizer;

use super::BenchArgs;
use super::plot::{check_plot_path, draw_plot};
use super::report::{CurvePoint, Record, fill_speedups, mean_sd, to_csv, to_markdown};

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
    /// Multiply-adds of the layers' matrix products per prompt token (no output head).
    layer_macs: u64,
    /// Whether the layers' matrices are float (F32, F16, BF16), whose products run on FMA, not integer dots.
    float_weights: bool,
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
            layer_macs: model.weights.layer_macs(model.config.moe.map_or(0, |m| m.n_used)),
            float_weights: model
                .weights
                .layers
                .first()
                .is_some_and(|l| matches!(l.wq.ty, GgmlType::F32 | GgmlType::F16 | GgmlType::BF16)),
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

    /// KV blocks of [`DEFAULT_BLOCK_SIZE`] the test runs on (`None`: more than a `usize` counts), the one sizing
    /// that both [`check_pool_fits`] and [`Runner::target`] use: for pp/tg its positions rounded up to whole
    /// blocks; for the curve, each sequence's prompt, generation and one more token, plus the spare block per
    /// sequence that the scheduler keeps free for a running request.
    fn kv_blocks(self) -> Option<usize> {
        match self {
            Test::Curve { batch, prompt, gen_len } => {
                let positions = prompt.max(1).checked_add(gen_len)?.checked_add(1)?;
                batch.checked_mul(positions.div_ceil(DEFAULT_BLOCK_SIZE) + 1)
            }
            _ => Some(self.positions().max(1).div_ceil(DEFAULT_BLOCK_SIZE)),
        }
    }
}

/// Refuses, before anything is measured, a test whose KV cache would not fit in memory (the size is computed with
/// checked arithmetic, so an absurd `-p`/`-d`/`--batch` is refused rather than overflowing).
fn check_pool_fits(model: &Model, kv_dtype: KvDtype, test: Test) -> anyhow::Result<()> {
    kv_dtype.check(&model.config)?;
    let cap = test.kv_blocks().and_then(|b| b.checked_mul(DEFAULT_BLOCK_SIZE));
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
    tokenizer: &'m Tokenizer,
    scratch: ForwardScratch,
    kv_dtype: KvDtype,
    ubatch: usize,
    rng: ChaCha8Rng,
}

/// What a test runs on: a bare KV pool for pp/tg, the engine for the batching curve. Made once per test, so that
/// the repetitions find its memory already touched.
enum Target<'m> {
    Pool(KvPool),
    Engine(Box<Scheduler<'m>>),
}

impl<'m> Runner<'m> {
    fn random_tokens(&mut self, n: usize) -> Vec<u32> {
        let n_vocab = self.model.config.n_vocab as u32;
        (0..n).map(|_| self.rng.random_range(0..n_vocab)).collect()
    }

    /// What `test` runs on: for pp/tg a pool with room for its positions (rounded up to whole blocks); for the
    /// curve an engine whose first step takes every prompt whole and whose pool holds every sequence.
    fn target(&self, test: Test) -> anyhow::Result<Target<'m>> {
        // Sized by `check_pool_fits` already, which refused a test whose count overflows.
        let blocks = test.kv_blocks().context("KV cache size overflows")?;
        match test {
            Test::Curve { batch, prompt, gen_len } => {
                let config = EngineConfig {
                    n_ctx: prompt.max(1) + gen_len + 1,
                    max_seqs: batch,
                    max_batch_tokens: (batch * prompt).max(batch),
                    max_queue: batch,
                    kv: KvBudget::Blocks(blocks),
                    kv_dtype: self.kv_dtype,
                    prefix_cache: false,
                    threads: 1,
                };
                Ok(Target::Engine(Box::new(Scheduler::new(self.model, self.tokenizer, config)?)))
            }
            _ => {
                let cap = blocks * DEFAULT_BLOCK_SIZE;
                Ok(Target::Pool(KvPool::new(&self.model.config, self.kv_dtype, cap, cap)))
            }
        }
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

    /// Runs `test` once on what [`Runner::target`] made for it.
    fn run_once(&mut self, test: Test, target: &mut Target<'m>) -> anyhow::Result<Sample> {
        let pool = match target {
            Target::Pool(pool) => pool,
            Target::Engine(sched) => {
                let Test::Curve { batch, prompt, gen_len } = test else { unreachable!("engines run curves") };
                let prompts: Vec<Vec<u32>> = (0..batch).map(|_| self.random_tokens(prompt.max(1))).collect();
                return curve_once(sched, &prompts, prompt > 0, gen_len);
            }
        };
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
            Test::Curve { .. } => unreachable!("curves run on an engine"),
        }
    }
}

/// One run of the batching curve: `prompts.len()` requests through the engine. With `prefill`, the first step runs
/// every prompt and samples each sequence's first token (timed as T_PP), and `gen_len` more steps each decode one
/// token per sequence (T_TG); without, the prompts are single tokens and all `gen_len` steps are decode steps.
fn curve_once(
    sched: &mut Scheduler<'_>,
    prompts: &[Vec<u32>],
    prefill: bool,
    gen_len: usize,
) -> anyhow::Result<Sample> {
    let batch = prompts.len();
    let mut streams = Vec::with_capacity(batch);
    for p in prompts {
        let req = Request {
            prompt: p.clone(),
            max_tokens: gen_len + usize::from(prefill),
            sampling: SamplingParams::GREEDY,
            stop: Vec::new(),
            ignore_eos: true,
            logprobs: false,
            top_logprobs: 0,
            format: OutputFormat::Text,
            logit_bias: Default::default(),
            dry_breakers: None,
        };
        streams.push(sched.submit(req)?);
    }
    let (mut pp, mut cpu_pp) = (0.0, None);
    if prefill {
        let watch = Stopwatch::start();
        let step = sched.step();
        (pp, cpu_pp) = watch.stop();
        anyhow::ensure!(step.sampled.len() == batch, "the prefill step ran {} of {batch} prompts", step.sampled.len());
    }
    let watch = Stopwatch::start();
    let mut steps = 0;
    while !sched.is_idle() {
        let step = sched.step();
        anyhow::ensure!(step.decode_tokens == batch, "a decode step ran {} of {batch} sequences", step.decode_tokens);
        steps += 1;
    }
    let (tg, cpu_tg) = watch.stop();
    anyhow::ensure!(steps == gen_len, "{steps} decode steps instead of {gen_len}");
    for s in streams {
        s.collect().map_err(anyhow::Error::msg)?;
    }
    Ok(Sample { pp, tg, cpu_pp, cpu_tg })
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
        vec![crate::cpu_topology::default_threads().threads]
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
        let tokenizer = Tokenizer::from_gguf(model.file())
            .with_context(|| format!("loading the tokenizer of {}", path.display()))?;
        models.push((model, tokenizer, info));
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

    // The read probe runs before the tests and again after each one, and each thread count's records get the best
    // rate it gave: a neighbour's burst of memory traffic slows a probe as it slows a test, so one probe taken in a
    // busy moment would put decode's share of the limit too high (on a shared Zen 1, one probe beside one run gave
    // anywhere from 58% to 77% for the same decode).
    let probe = |pool: &rayon::ThreadPool| args.bandwidth.then(|| pool.install(crate::cli::membw::read_gbs));
    // Per pool: the best and the lowest rate so far, and how many probes ran.
    let mut read_gbs: Vec<Option<(f64, f64, usize)>> =
        pools.iter().map(|(_, pool)| probe(pool).map(|g| (g, g, 1))).collect();
    // Which pool each record came from, to give it that pool's best rate at the end.
    let mut record_pool: Vec<usize> = Vec::new();
    let peaks: Vec<Option<(peak::Rate, peak::Rate)>> = pools
        .iter()
        .map(|(_, pool)| args.peak.then(|| pool.install(|| peak::measure(infer_kernels::dispatch::isa()))))
        .collect();
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
    'models: for (model, tokenizer, info) in &models {
        let mut runner = Runner {
            model,
            tokenizer,
            scratch: ForwardScratch::new(model),
            kv_dtype: args.engine.kv_dtype(),
            ubatch: args.ubatch,
            rng: ChaCha8Rng::seed_from_u64(TOKEN_SEED),
        };
        for (pi, ((n_threads, pool), peaks)) in pools.iter().zip(&peaks).enumerate() {
            for &test in &tests {
                progress.set_message(format!("{} {} t{}", info.model_type, test.name(), n_threads));
                let samples = pool.install(|| -> anyhow::Result<Vec<Sample>> {
                    let mut target = runner.target(test)?;
                    let mut samples = Vec::with_capacity(args.repetitions);
                    for i in 0..runs_per_test {
                        if cancelled() {
                            break;
                        }
                        let sample = runner.run_once(test, &mut target)?;
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
                let mut record = make_record(&build, info, &isa, *n_threads, &args, test, &samples);
                if let (Some((best, low, n)), Some(now)) = (read_gbs[pi], probe(pool)) {
                    read_gbs[pi] = Some((best.max(now), low.min(now), n + 1));
                }
                if let Some((fma, int)) = peaks {
                    record.peak_fma_gflops = Some(2.0 * fma.g_macs);
                    record.peak_int_gmacs = Some(int.g_macs);
                    if let Test::Prompt(..) = test {
                        let g_macs = info.layer_macs as f64 * record.avg_ts / 1e9;
                        record.matrix_gflops = Some(2.0 * g_macs);
                        // Integer multiply-adds per weight multiply-add: the AVX-512 kernels run one 8-bit
                        // product per activation part (two for q8x2); the AVX2 ones fuse the parts into one
                        // 16-bit value. The scalar level has no peak worth comparing with, nor has the amx level,
                        // whose prefill products run on the tile unit (its peak is not probed).
                        record.peak_share = match (infer_kernels::dispatch::isa(), info.float_weights) {
                            (Isa::Scalar | Isa::Amx, _) => None,
                            (_, true) => Some(g_macs / fma.g_macs),
                            (Isa::Avx512, false) => Some(g_macs * model.precision().group() as f64 / int.g_macs),
                            (Isa::Avx2, false) => Some(g_macs / int.g_macs),
                        };
                    }
                }
                records.push(record);
                record_pool.push(pi);
            }
        }
    }
    progress.finish_and_clear();
    for (record, &pi) in records.iter_mut().zip(&record_pool) {
        if let Some((best, low, n)) = read_gbs[pi] {
            (record.mem_read_gbs, record.mem_read_gbs_low, record.mem_read_probes) = (Some(best), Some(low), Some(n));
        }
    }
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
        mem_read_gbs: None,
        mem_read_gbs_low: None,
        mem_read_probes: None,
        peak_fma_gflops: None,
        peak_int_gmacs: None,
        matrix_gflops: None,
        peak_share: None,
        curve,
    }
}
