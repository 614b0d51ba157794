//! `infer perplexity MODEL -f TEXT`: perplexity by llama-perplexity's method (see [`crate::eval`]).

use std::path::PathBuf;

use anyhow::Context;
use clap::Args;

use super::EngineArgs;
use super::args::ThreadArgs;
use super::output::{eprint_lossy, eprintln_lossy, print_line};
use crate::eval::{EvalError, perplexity, tokenize_text};

#[derive(Args, Debug)]
pub struct PerplexityArgs {
    /// Model: a GGUF file or a registry name [default: the registry's default model].
    #[arg(value_name = "MODEL")]
    pub model: Option<String>,
    /// The text to score.
    #[arg(short = 'f', long = "file", value_name = "TEXT_FILE")]
    pub file: PathBuf,
    #[command(flatten)]
    pub chunking: ChunkArgs,
    /// Print one JSON object instead of text.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub threads: ThreadArgs,
    #[command(flatten)]
    pub engine: EngineArgs,
}

// How a text is cut for scoring (shared with `compare -f`). (Plain comment: a doc comment on a flattened `Args`
// struct would replace the command's `about` text.)
#[derive(Args, Debug, Clone, Copy)]
pub struct ChunkArgs {
    /// Tokens per chunk; the second half of each chunk is scored, as llama-perplexity does.
    #[arg(short = 'c', long = "ctx-size", value_name = "N", default_value_t = 512,
          value_parser = clap::value_parser!(u32).range(4..=131072))]
    pub ctx: u32,
    /// Score at most this many chunks.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    pub chunks: Option<u32>,
}

/// Reads a text file for scoring, naming it in errors.
pub fn read_text(path: &std::path::Path) -> anyhow::Result<String> {
    std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))
}

pub fn run(args: PerplexityArgs) -> anyhow::Result<()> {
    let text = read_text(&args.file)?;
    // Ctrl-C stops after the chunk in progress; the chunks finished are still reported.
    let cancel = super::cancel_on_ctrl_c();
    let loaded = super::load(args.model.as_deref(), &args.engine)?;
    args.engine.kv_dtype().check(&loaded.model.config)?;
    let tokens = tokenize_text(&loaded.tokenizer, &text);
    let bos = loaded.tokenizer.add_bos().then(|| loaded.tokenizer.bos()).flatten();
    let json = args.json;
    let mut planned = 0;
    let result = args
        .threads
        .install(|| {
            let mut on_chunk = |i: usize, n: usize, ppl: f64| {
                planned = n;
                if !json {
                    eprint_lossy!("[{}]{ppl:.4},", i + 1);
                    if i + 1 == n {
                        eprintln_lossy!();
                    }
                }
            };
            let chunks = args.chunking.chunks.map(|c| c as usize);
            let (ctx, kv) = (args.chunking.ctx as usize, args.engine.kv_dtype());
            perplexity(&loaded.model, &tokens, ctx, kv, chunks, bos, &cancel, &mut on_chunk)
        })
        .context("starting worker threads")?;
    let result = match result {
        Err(EvalError::Cancelled) => return Err(super::Interrupted.into()),
        r => r.with_context(|| format!("scoring {}", args.file.display()))?,
    };
    let interrupted = result.chunks < planned;
    if json {
        let mut v = serde_json::to_value(&result)?;
        v["model"] = serde_json::Value::String(loaded.model.file().path().display().to_string());
        v["file"] = serde_json::Value::String(args.file.display().to_string());
        v["interrupted"] = serde_json::Value::Bool(interrupted);
        print_line(&v.to_string())?;
    } else {
        if interrupted {
            eprintln_lossy!();
        }
        let (of, why) = if interrupted { (format!(" of {planned}"), " (interrupted)") } else { (String::new(), "") };
        eprintln_lossy!(
            "{}{of} chunks of {} tokens{why}, {} tokens scored, {:.1} s",
            result.chunks,
            result.n_ctx,
            result.tokens_scored,
            result.seconds
        );
        print_line(&format!("Final estimate: PPL = {:.4} +/- {:.5}", result.ppl, result.ppl_err))?;
    }
    if interrupted {
        return Err(super::Interrupted.into());
    }
    Ok(())
}
