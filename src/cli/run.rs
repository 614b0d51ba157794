//! `infer run [MODEL] -p PROMPT`: one-shot generation, streamed to stdout as it is produced.
//!
//! stdout carries only the model's text (or, with `--json`, one JSON object at the end); timings and notes go to
//! stderr, and only when stdout is a terminal (a person is watching) unless `--verbose` asks for them.

use std::io::IsTerminal;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use clap::Args;
use serde_json::{Value, json};

use crate::cli::EngineArgs;
use crate::cli::args::{DraftArgs, FormatArgs, LengthArgs, SamplingArgs, StopArgs, ThreadArgs};
use crate::cli::input::{MAX_INPUT_BYTES, read_text, read_text_file};
use crate::cli::output::{eprintln_lossy, print_flush};
use crate::session::{FinishReason, GenerateRequest, Generation, Session, Timings};
use crate::tokenizer::chat::ChatMessage;

#[derive(Args, Debug)]
pub struct RunArgs {
    /// Model: a .gguf path or a registry name (default: the registry's default model, fetched on first use).
    pub model: Option<String>,
    /// The prompt.
    #[arg(short = 'p', long, value_name = "TEXT", conflicts_with = "file")]
    pub prompt: Option<String>,
    /// Read the prompt from a file (`-` = stdin). Without -p or -f, a piped stdin is the prompt.
    #[arg(short = 'f', long, value_name = "FILE")]
    pub file: Option<String>,
    #[command(flatten)]
    pub length: LengthArgs,
    /// Wrap the prompt in the model's chat template (as one user turn).
    #[arg(long)]
    pub chat: bool,
    /// A system message for --chat.
    #[arg(long, value_name = "TEXT", requires = "chat")]
    pub system: Option<String>,
    /// A Jinja chat template file, or a built-in name (chatml, gemma, ...), instead of the model's own.
    #[arg(long = "chat-template", value_name = "FILE|NAME", requires = "chat")]
    pub chat_template: Option<String>,
    /// Keep generating after end-of-generation tokens.
    #[arg(long)]
    pub ignore_eos: bool,
    /// Print one JSON object at the end (text, tokens, finish_reason, seed, timings) instead of streaming text.
    #[arg(long)]
    pub json: bool,
    /// Print timings on stderr even when stdout is not a terminal.
    #[arg(short = 'v', long)]
    pub verbose: bool,
    #[command(flatten)]
    pub sampling: SamplingArgs,
    #[command(flatten)]
    pub format: FormatArgs,
    #[command(flatten)]
    pub stop: StopArgs,
    #[command(flatten)]
    pub draft: DraftArgs,
    #[command(flatten)]
    pub threads: ThreadArgs,
    #[command(flatten)]
    pub engine: EngineArgs,
}

fn read_prompt(args: &RunArgs) -> anyhow::Result<String> {
    match (&args.prompt, &args.file) {
        (Some(p), _) if p.len() > MAX_INPUT_BYTES => {
            bail!("the prompt is {} bytes; the limit is {MAX_INPUT_BYTES}", p.len())
        }
        (Some(p), _) => Ok(p.clone()),
        (None, Some(f)) if f == "-" => read_text(std::io::stdin(), "the prompt on stdin"),
        (None, Some(f)) => read_text_file(std::path::Path::new(f)).with_context(|| format!("prompt file {f}")),
        (None, None) if !std::io::stdin().is_terminal() => read_text(std::io::stdin(), "the prompt on stdin"),
        (None, None) => bail!("no prompt: give -p TEXT, -f FILE, or pipe it on stdin"),
    }
}

pub fn run(args: RunArgs) -> anyhow::Result<()> {
    let prompt_text = read_prompt(&args)?;
    let params = args.sampling.to_params();
    params.validate()?;
    let dry_breakers = args.sampling.dry_breakers().map_err(anyhow::Error::msg)?;
    // Timings are for a person watching the text: quiet when stdout goes to a pipe or file, unless -v asks.
    let show_stats = args.verbose || std::io::stdout().is_terminal();

    let load_start = Instant::now();
    let loaded = super::load(args.model.as_deref(), &args.engine)?;
    let (model, tokenizer) = (&loaded.model, &loaded.tokenizer);
    let load_time = load_start.elapsed();

    let mut template_notes = Vec::new();
    let prompt_text = if args.chat {
        let template = super::chat_template(model, args.chat_template.as_deref())?;
        template_notes =
            super::template_notes(model, tokenizer, args.chat_template.as_deref(), &template, &args.stop.stop);
        let mut messages = Vec::new();
        if let Some(sys) = &args.system {
            messages.push(ChatMessage::new("system", sys.clone()));
        }
        messages.push(ChatMessage::new("user", prompt_text));
        template.render(&messages, true).context("rendering the chat template")?
    } else {
        prompt_text
    };
    // A raw prompt gets BOS if the model asks for it; a rendered chat prompt gets it unless the template wrote it.
    let prompt =
        if args.chat { tokenizer.encode_prompt(&prompt_text) } else { tokenizer.encode(&prompt_text, true, true) };
    let n_ctx = args.length.n_ctx(model.config.n_ctx_train);
    super::check_context(model, n_ctx, args.engine.kv_dtype())?;
    if prompt.len() > n_ctx {
        bail!("the prompt is {} tokens, but the context holds {n_ctx}: shorten it or raise --ctx-size", prompt.len());
    }
    let max_tokens = args.length.max_tokens().unwrap_or(usize::MAX);
    let req = GenerateRequest {
        prompt,
        max_tokens,
        sampling: params,
        stop: args.stop.stop.clone(),
        ignore_eos: args.ignore_eos,
        format: args.format.output_format(),
        logit_bias: args.sampling.logit_bias(),
        dry_breakers,
        draft: args.draft.params(),
    };

    let cancel = super::cancel_on_ctrl_c();
    let pool = args.threads.build_pool().context("starting worker threads")?;
    crate::timeline::mark!("prompt tokenized ({} tokens), worker threads started", req.prompt.len());
    let mut session = Session::new(model, tokenizer, n_ctx, args.engine.kv_dtype());
    crate::timeline::mark!("session made (KV cache reserved)");
    let json_mode = args.json;
    let mut wrote_any = false;
    for note in &template_notes {
        eprintln_lossy!("{note}");
    }
    let result = pool.install(|| {
        session.generate(&req, &cancel, &mut |text| {
            if !json_mode && !text.is_empty() {
                wrote_any = true;
                print_flush(text)?;
            }
            Ok(())
        })
    })?;
    crate::timeline::mark!("generation done");
    if !json_mode && wrote_any && std::io::stdout().is_terminal() {
        print_flush("\n")?;
    }
    if json_mode {
        let out = generation_json(&result, params.seed, req.prompt.len(), load_time, args.threads.count());
        crate::cli::output::print_line(&out.to_string())?;
    }
    if result.context_full {
        eprintln_lossy!(
            "note: the context ({n_ctx} tokens) is full; generation stopped (finish_reason length). Raise --ctx-size for longer output."
        );
    }
    if result.finish == FinishReason::Cancelled {
        eprintln_lossy!("note: interrupted");
    }
    if show_stats {
        eprintln_lossy!("{}", timing_line(Some(load_time), &result.timings, args.threads.count(), params.seed));
    }
    if args.verbose {
        eprintln_lossy!("{}", memory_line(model, tokenizer, Session::kv_bytes(model, n_ctx, args.engine.kv_dtype())));
    }
    Ok(())
}

/// `-v`'s account of where the resident bytes are: the file's map (its size, and how much of it is resident), the
/// weights held outside it (panels), the KV cache as reserved, the vocabulary's text and the tokenizer's tables, and
/// the rest (the KV cache's touched pages, scratch, heap, code: the cache comes from zeroed pages that become
/// resident only as positions fill, so it cannot be told apart from the rest); then the resident set now and at its
/// peak. Figures the platform does not give are left out.
fn memory_line(model: &crate::model::Model, tokenizer: &crate::tokenizer::Tokenizer, kv: Option<u64>) -> String {
    use crate::memory::bytes;
    let file = model.file();
    let mapped = file.tensor_bytes_total();
    let resident = crate::memory::mapped_resident(file.path());
    let panels = model.weights.owned_bytes() as u64;
    let kv = kv.unwrap_or(0);
    let mut parts = vec![match resident {
        Some(r) => format!("weights {} mapped, {} of it resident", bytes(mapped), bytes(r)),
        None => format!("weights {} mapped", bytes(mapped)),
    }];
    parts.push(format!("panels {}", bytes(panels)));
    parts.push(format!("KV {} reserved", bytes(kv)));
    let (vocab, tables) = tokenizer.heap_bytes();
    let (vocab, tables) = (vocab as u64, tables as u64);
    parts.push(format!("vocabulary {}, tokenizer tables {}", bytes(vocab), bytes(tables)));
    if let Some((rss, peak)) = crate::memory::resident() {
        let known = resident.unwrap_or(0) + panels + vocab + tables;
        parts.push(format!("KV in use, scratch and the rest {}", bytes(rss.saturating_sub(known))));
        parts.push(format!("RSS {}, peak {}", bytes(rss), bytes(peak)));
    }
    format!("[ memory: {} ]", parts.join(" | "))
}

/// `--json`'s object for one generation: its text and tokens, why it ended, the seed, and the timings (with the
/// worker thread count they were measured with).
pub fn generation_json(
    result: &Generation,
    seed: u64,
    prompt_tokens: usize,
    load_time: Duration,
    threads: usize,
) -> Value {
    let t = &result.timings;
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    json!({
        "text": result.text,
        "tokens": result.tokens,
        "finish_reason": result.finish.as_str(),
        "seed": seed,
        "prompt_tokens": prompt_tokens,
        "timings": {
            "load_ms": ms(load_time),
            "prompt_tokens": t.prompt_tokens,
            "prompt_ms": ms(t.prompt_time),
            "prompt_tokens_per_second": t.prompt_tps(),
            "generated_tokens": t.generated_tokens,
            "generation_ms": ms(t.generate_time),
            "generation_tokens_per_second": t.generate_tps(),
            "first_token_ms": t.first_token.map(ms),
            "draft_tokens": t.draft.drafted,
            "draft_accepted": t.draft.accepted,
            "threads": threads,
        },
    })
}

/// The timing line for a person: `[ load … | prompt … | generation … | threads, ISA | seed … ]`.
pub fn timing_line(load_time: Option<Duration>, t: &Timings, threads: usize, seed: u64) -> String {
    let load = load_time.map(|d| format!("load {:.0} ms | ", d.as_secs_f64() * 1e3)).unwrap_or_default();
    let d = &t.draft;
    let draft = if d.passes == 0 {
        String::new()
    } else {
        format!(" | draft {}/{} accepted ({:.0}%)", d.accepted, d.drafted, 100.0 * d.acceptance())
    };
    format!(
        "[ {load}prompt {} tokens, {:.1} t/s | generation {} tokens, {:.1} t/s{draft} | {threads} threads, {} | seed {seed} ]",
        t.prompt_tokens,
        t.prompt_tps(),
        t.generated_tokens,
        t.generate_tps(),
        crate::cli::isa_in_use(),
    )
}
