//! The command line: one clap subcommand per job, each in its own module with an `Args` struct and a `run`.
//!
//! Commands write model text and machine-readable output to stdout, everything else (progress, timings, warnings)
//! to stderr. Errors come back as `anyhow::Error` with context naming the file, key or flag involved.

use clap::{Parser, Subcommand};

use crate::cli::output::eprintln_lossy;

pub mod args;
pub mod bench;
pub mod chat;
pub mod compare;
pub mod doctor;
pub mod info;
pub mod input;
pub mod list;
pub mod logits;
pub mod membw;
pub mod output;
pub mod peak;
pub mod perplexity;
pub mod pull;
pub mod quantize;
pub mod run;
pub mod serve;
pub mod tokenize;

/// Run GGUF language models on ordinary CPUs.
#[derive(Parser, Debug)]
#[command(name = "infer", version, about, long_about = None, propagate_version = true)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Show a GGUF file's metadata, tensors and the SIMD level in use.
    Info(info::InfoArgs),
    /// Fetch registry models into the cache ($INFER_HOME/models), verified by sha256.
    Pull(pull::PullArgs),
    /// Print the token ids of a text (or of JSON strings read line by line with --jsonl).
    Tokenize(tokenize::TokenizeArgs),
    /// List the registry's models and which are cached.
    List(list::ListArgs),
    /// Generate text from a prompt, streamed to stdout.
    Run(run::RunArgs),
    /// Chat with a model: line editing and history on a terminal, one message per line from a pipe.
    Chat(chat::ChatArgs),
    /// Print the top-K raw logits at every position of token-id sequences read from stdin (fidelity checks).
    Logits(logits::LogitsArgs),
    /// Measure speed: prefill (pp), generation (tg) and the batched-decode curve (--batch), like llama-bench.
    Bench(Box<bench::BenchArgs>),
    /// Serve an OpenAI-compatible HTTP API, batching many requests at once.
    Serve(serve::ServeArgs),
    /// Convert a model's tensors to another type (f32, f16, bf16, q8_0, q6_k, q5_0, q4_1, q4_0, q4_k, q2_k).
    Quantize(quantize::QuantizeArgs),
    /// Compare two models with the same vocabulary: KL divergence, top-1 agreement, perplexities, greedy texts.
    Compare(compare::CompareArgs),
    /// Perplexity of a model on a text, by llama-perplexity's method.
    Perplexity(perplexity::PerplexityArgs),
    /// Check a model file before trusting it: tokenizer, special tokens, chat template, a short run.
    Doctor(doctor::DoctorArgs),
}

/// Runs one parsed command line.
pub fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Info(args) => info::run(args),
        Command::Pull(args) => pull::run(args),
        Command::Tokenize(args) => tokenize::run(args),
        Command::List(args) => list::run(args),
        Command::Logits(args) => logits::run(args),
        Command::Run(args) => run::run(args),
        Command::Chat(args) => chat::run(args),
        Command::Bench(args) => bench::run(*args),
        Command::Serve(args) => serve::run(args),
        Command::Quantize(args) => quantize::run(args),
        Command::Compare(args) => compare::run(args),
        Command::Perplexity(args) => perplexity::run(args),
        Command::Doctor(args) => doctor::run(args),
    }
}

/// A command stopped early by Ctrl-C after printing what it had: the process exits with status 130 (as a shell
/// reports an interrupted program) and a note rather than an error line.
#[derive(Debug, thiserror::Error)]
#[error("interrupted")]
pub struct Interrupted;

/// Whether an error chain bottoms out in a closed pipe (the reader went away: not our failure).
pub fn is_broken_pipe(err: &anyhow::Error) -> bool {
    err.chain().any(|cause| {
        cause.downcast_ref::<std::io::Error>().is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
    })
}

/// Resolves a MODEL argument (path or registry name; `None` = the default model, fetched on first use).
pub fn resolve_model_arg(spec: Option<&str>) -> anyhow::Result<std::path::PathBuf> {
    crate::registry::resolve_model(spec)
}

/// The CPU's SIMD features that matter to the kernels.
pub fn cpu_features() -> Vec<&'static str> {
    #[allow(unused_mut)]
    let mut out = Vec::new();
    #[cfg(target_arch = "x86_64")]
    {
        macro_rules! probe {
            ($($f:tt),*) => {$( if std::is_x86_feature_detected!($f) { out.push($f); } )*};
        }
        probe!("avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512vnni", "avx512bf16", "avxvnni");
        // AMX tiles count only where the OS lets the process use them (the `amx` level's own check).
        if infer_kernels::dispatch::Isa::Amx.is_supported() {
            out.push("amx-bf16");
            out.push("amx-int8");
        }
    }
    out
}

/// The kernel level in use (chosen once at start-up; `INFER_ISA` overrides).
pub fn isa_in_use() -> String {
    match infer_kernels::dispatch::try_isa() {
        Ok(isa) => isa.to_string(),
        Err(e) => format!("error: {e}"),
    }
}

/// A model and its tokenizer, loaded for a command.
pub struct Loaded {
    pub path: std::path::PathBuf,
    pub model: crate::model::Model,
    pub tokenizer: crate::tokenizer::Tokenizer,
}

/// Resolves MODEL, checks the kernel level (loading already repacks weights for it, so a bad `INFER_ISA` must be
/// reported before), and loads the model with the engine settings, with errors naming the file.
pub fn load_model(
    spec: Option<&str>,
    engine: &EngineArgs,
) -> anyhow::Result<(std::path::PathBuf, crate::model::Model)> {
    use anyhow::Context;
    infer_kernels::dispatch::try_isa().context("INFER_ISA")?;
    let path = resolve_model_arg(spec)?;
    let model = load_model_at(&path, engine)?;
    Ok((path, model))
}

/// Loads the model at `path` with the engine settings: memory-mapped, or read into memory with `--no-mmap`.
pub fn load_model_at(path: &std::path::Path, engine: &EngineArgs) -> anyhow::Result<crate::model::Model> {
    model_from(open_gguf(path, engine)?, path, engine)
}

/// Opens the GGUF file at `path`: memory-mapped, or read into memory with `--no-mmap`.
fn open_gguf(path: &std::path::Path, engine: &EngineArgs) -> anyhow::Result<std::sync::Arc<crate::gguf::GgufFile>> {
    use anyhow::Context;
    let file = if engine.no_mmap {
        let len = std::fs::metadata(path).map(|m| m.len()).ok();
        crate::memory::check_fits(&format!("reading {} into memory (--no-mmap)", path.display()), len, "")?;
        crate::gguf::GgufFile::read(path)
    } else {
        crate::gguf::GgufFile::open(path)
    };
    Ok(std::sync::Arc::new(file.with_context(|| format!("loading {}", path.display()))?))
}

/// The model in an opened file, with the engine settings (loading repacks its weights for the kernel level).
fn model_from(
    file: std::sync::Arc<crate::gguf::GgufFile>,
    path: &std::path::Path,
    engine: &EngineArgs,
) -> anyhow::Result<crate::model::Model> {
    use anyhow::Context;
    let mut model = crate::model::Model::from_file(file).with_context(|| format!("loading {}", path.display()))?;
    model.set_precision(engine.precision());
    Ok(model)
}

/// [`load_model`] plus the model's tokenizer. The tokenizer is built on a thread of its own while the model loads:
/// building it is serial work (Gemma 3's 262k-entry vocabulary: ~0.2 G instructions), and repacking the weights
/// leaves the cores idle while it waits on page faults, so side by side they finish sooner than one after the other
/// (Gemma 3, launch to exit of `run -n 1`, quiet host: see the commit). A model error is reported before a
/// tokenizer error, as when they ran in turn.
pub fn load(spec: Option<&str>, engine: &EngineArgs) -> anyhow::Result<Loaded> {
    use anyhow::Context;
    infer_kernels::dispatch::try_isa().context("INFER_ISA")?;
    let path = resolve_model_arg(spec)?;
    let file = open_gguf(&path, engine)?;
    crate::timeline::mark!("opened {} (header, metadata and tensor table parsed)", path.display());
    let (model, tokenizer) = std::thread::scope(|s| {
        let for_tokenizer = std::sync::Arc::clone(&file);
        let tokenizer = std::thread::Builder::new().name("tokenizer".into()).spawn_scoped(s, move || {
            let built = crate::tokenizer::Tokenizer::from_gguf(&for_tokenizer);
            crate::timeline::mark!("tokenizer built");
            built
        });
        let model = model_from(file, &path, engine);
        crate::timeline::mark!("model loaded");
        (model, tokenizer.map(|t| t.join()))
    });
    let model = model?;
    let tokenizer = match tokenizer.context("starting the tokenizer thread")? {
        Ok(built) => built.with_context(|| format!("loading the tokenizer of {}", path.display()))?,
        Err(panic) => std::panic::resume_unwind(panic),
    };
    Ok(Loaded { path, model, tokenizer })
}

/// Checks a context size before a session is made for it: a warning on stderr above the context the model was
/// trained for, and an error with the numbers, before anything is allocated, when its KV cache would not fit.
pub fn check_context(model: &crate::model::Model, n_ctx: usize, kv: crate::model::KvDtype) -> anyhow::Result<()> {
    kv.check(&model.config)?;
    let trained = model.config.n_ctx_train;
    if n_ctx > trained {
        eprintln_lossy!(
            "warning: a context of {n_ctx} tokens is more than this model was trained for ({trained}); text past \
             {trained} tokens may degrade"
        );
    }
    let bytes = crate::session::Session::kv_bytes(model, n_ctx, kv);
    crate::memory::check_fits(&format!("a context of {n_ctx} tokens (its KV cache)"), bytes, "lower -c/--ctx-size")?;
    Ok(())
}

/// The chat template for a model: `--chat-template` (a template file, or a built-in's name) or the model's own.
pub fn chat_template(
    model: &crate::model::Model,
    arg: Option<&str>,
) -> anyhow::Result<crate::tokenizer::chat::ChatTemplate> {
    use anyhow::Context;
    let source = chat_template_source(arg)?;
    crate::tokenizer::chat::ChatTemplate::from_gguf(model.file(), source.as_deref())
        .context("loading the chat template")
}

/// The template source a `--chat-template` argument stands for: a file's contents, else the argument itself (a
/// built-in's name or template text).
pub fn chat_template_source(arg: Option<&str>) -> anyhow::Result<Option<String>> {
    use crate::tokenizer::chat::ChatTemplate;
    Ok(match arg {
        Some(t) if std::path::Path::new(t).is_file() => Some(ChatTemplate::read_file(std::path::Path::new(t))?),
        Some(t) if t.contains('/') || t.ends_with(".jinja") => anyhow::bail!("no such chat template file: {t}"),
        Some(t) => Some(t.to_string()),
        None => None,
    })
}

/// Notes for stderr about the chat template in use:
/// - when it is a built-in stand-in for a file that has no chat template of its own (no `--chat-template` given).
///   Such a file is usually a base model (the registry's Gemma 3 270M is one), whose replies may not read as
///   answers: the note says why, and what to change;
/// - when it ends a turn with a special token that does not end generation (`infer doctor`'s "end of turn"
///   check), so replies would run on past the turn, and no `--stop` names that token yet.
///
/// Callers print them once the command has started for good, so a command that then fails still prints one line.
pub fn template_notes(
    model: &crate::model::Model,
    tokenizer: &crate::tokenizer::Tokenizer,
    arg: Option<&str>,
    template: &crate::tokenizer::chat::ChatTemplate,
    stops: &[String],
) -> Vec<String> {
    let mut notes = Vec::new();
    let own = model.file().metadata().get(crate::tokenizer::keys::CHAT_TEMPLATE).is_some();
    if arg.is_none() && !own {
        notes.push(format!(
            "note: the model has no chat template of its own (a base model?); using the built-in '{}' template, \
             which it may not follow (--chat-template picks another)",
            template.name()
        ));
    }
    if let Some(id) = crate::doctor::template::turn_token_that_runs_on(template, tokenizer) {
        let text = tokenizer.token_text(id).unwrap_or("?");
        if !stops.iter().any(|s| s == text) {
            notes.push(format!(
                "warning: the chat template ends each turn with {text:?} (token {id}), which does not end \
                 generation: replies may run on past their turn; --stop {text:?} ends them there"
            ));
        }
    }
    notes
}

/// A flag that Ctrl-C sets; generation checks it between tokens and stops. A second Ctrl-C while the flag is still
/// set (the first not yet honoured) exits at once with status 130. Callers clear the flag once they have stopped.
pub fn cancel_on_ctrl_c() -> std::sync::Arc<std::sync::atomic::AtomicBool> {
    use std::sync::atomic::{AtomicBool, Ordering};
    let cancel = std::sync::Arc::new(AtomicBool::new(false));
    let flag = cancel.clone();
    let _ = ctrlc::set_handler(move || {
        if flag.swap(true, Ordering::SeqCst) {
            std::process::exit(130);
        }
    });
    cancel
}

/// Engine settings shared by every command that runs a model.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct EngineArgs {
    /// Activation precision of the integer dot products: `q8x2` keeps activations to ~16 bits (close to f32),
    /// `q8` quantizes them to 8 bits like llama.cpp (faster prefill, slightly less accurate).
    #[arg(long, value_name = "P", value_parser = ["q8x2", "q8"], default_value = "q8x2", help_heading = "Engine")]
    pub precision: String,
    /// Element type of the KV cache: `q8_0` holds keys and values in 8 bits (blocks of 32 with an f32 scale),
    /// 0.56× the memory of f16 for long contexts and many sequences, at a small cost in accuracy.
    #[arg(long = "kv-type", value_name = "T", value_parser = ["f16", "f32", "q8_0"], default_value = "f16", help_heading = "Engine")]
    pub kv_type: String,
    /// Read the model file into memory instead of mapping it: changes to the file on disk while infer runs then
    /// cannot affect it (a mapped file that shrinks stops infer with an error).
    #[arg(long = "no-mmap", help_heading = "Engine")]
    pub no_mmap: bool,
}

impl EngineArgs {
    pub fn precision(&self) -> infer_kernels::matmul::ActPrecision {
        match self.precision.as_str() {
            "q8" => infer_kernels::matmul::ActPrecision::Q8,
            _ => infer_kernels::matmul::ActPrecision::Q8x2,
        }
    }

    pub fn kv_dtype(&self) -> crate::model::KvDtype {
        crate::model::KvDtype::parse(&self.kv_type).unwrap_or(crate::model::KvDtype::F16)
    }
}
