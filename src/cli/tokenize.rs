//! `infer tokenize MODEL`: text → token ids with the model's own tokenizer (like llama.cpp's `llama-tokenize`).
//!
//! - `-p TEXT` prints the ids as one JSON array; `-f FILE` tokenizes a file; with neither, stdin is the text.
//! - `--jsonl` reads one JSON string per line from stdin (an object with a `"text"` string is accepted too) and
//!   prints one JSON array of ids per line; the model is loaded once.
//! - `--pieces` prints `id -> "piece"` lines instead of the array; `--no-bos` adds no BOS (nor EOS);
//!   `--no-parse-special` treats control-token text such as `<|im_start|>` as plain text; `--stats` reports the
//!   token count and throughput on stderr.

use std::io::{BufWriter, Write};
use std::path::PathBuf;
use std::time::Instant;

use anyhow::{Context, bail};
use clap::Args;

use crate::cli::input::{MAX_INPUT_BYTES, read_line, read_text, read_text_file};
use crate::cli::output::eprintln_lossy;
use crate::gguf::GgufFile;
use crate::tokenizer::Tokenizer;

#[derive(Args, Debug)]
pub struct TokenizeArgs {
    /// Model: a .gguf path or a registry name.
    pub model: Option<String>,
    /// The text to tokenize.
    #[arg(short = 'p', long = "prompt", value_name = "TEXT", conflicts_with_all = ["file", "jsonl"])]
    pub prompt: Option<String>,
    /// Tokenize the contents of a file.
    #[arg(short = 'f', long = "file", value_name = "FILE", conflicts_with = "jsonl")]
    pub file: Option<PathBuf>,
    /// Read one JSON string per line from stdin and print one JSON array of ids per line.
    #[arg(long)]
    pub jsonl: bool,
    /// Do not add the BOS (or EOS) token the model's metadata asks for.
    #[arg(long)]
    pub no_bos: bool,
    /// Print each token as `id -> "piece"` instead of a JSON array.
    #[arg(long, conflicts_with = "jsonl")]
    pub pieces: bool,
    /// Treat special-token text (`<|im_start|>`) as plain text.
    #[arg(long)]
    pub no_parse_special: bool,
    /// Report the number of tokens and the throughput on stderr.
    #[arg(long)]
    pub stats: bool,
}

pub fn run(args: TokenizeArgs) -> anyhow::Result<()> {
    let path = crate::registry::resolve_model(args.model.as_deref())?;
    let file = GgufFile::open(&path).with_context(|| format!("opening {}", path.display()))?;
    let tok = Tokenizer::from_gguf(&file).with_context(|| format!("building the tokenizer of {}", path.display()))?;
    drop(file);
    let add_special = !args.no_bos;
    let parse_special = !args.no_parse_special;
    let stdout = std::io::stdout();
    let mut out = BufWriter::new(stdout.lock());

    if args.jsonl {
        let stdin = std::io::stdin();
        let (mut n_bytes, mut n_tokens) = (0usize, 0usize);
        let start = Instant::now();
        let mut stdin = stdin.lock();
        for i in 1.. {
            let Some(line) = read_line(&mut stdin, MAX_INPUT_BYTES, i)? else { break };
            let text = parse_jsonl_line(&line).with_context(|| format!("stdin line {i}"))?;
            let ids = tok.encode(&text, add_special, parse_special);
            n_bytes += text.len();
            n_tokens += ids.len();
            // Serialized first, so that a closed stdout surfaces as the io::Error it is (quiet exit on `| head`).
            out.write_all(&serde_json::to_vec(&ids)?)?;
            out.write_all(b"\n")?;
            // Each answer as soon as it is ready: a program that writes a line and waits for its ids must get
            // them (the buffer held them until 8 KiB or the end of stdin).
            out.flush()?;
        }
        if args.stats {
            report(n_bytes, n_tokens, start);
        }
        return Ok(());
    }

    let text = match (&args.prompt, &args.file) {
        (Some(p), _) => p.clone(),
        (None, Some(f)) => read_text_file(f)?,
        (None, None) => read_text(std::io::stdin(), "the text on stdin")?,
    };
    let start = Instant::now();
    let ids = tok.encode(&text, add_special, parse_special);
    if args.stats {
        report(text.len(), ids.len(), start);
    }
    if args.pieces {
        for &id in &ids {
            let piece = String::from_utf8_lossy(tok.token_bytes(id, false));
            writeln!(out, "{id:>6} -> {}", serde_json::to_string(&piece)?)?;
        }
    } else {
        // Serialized first, so that a closed stdout surfaces as the io::Error it is (quiet exit on `| head`).
        out.write_all(&serde_json::to_vec(&ids)?)?;
        out.write_all(b"\n")?;
    }
    out.flush()?;
    Ok(())
}

/// A `--jsonl` line: a JSON string, or an object whose `"text"` is a string.
fn parse_jsonl_line(line: &[u8]) -> anyhow::Result<String> {
    let v: serde_json::Value = serde_json::from_slice(line).context("not valid JSON")?;
    match v {
        serde_json::Value::String(s) => Ok(s),
        serde_json::Value::Object(mut o) => match o.remove("text") {
            Some(serde_json::Value::String(s)) => Ok(s),
            _ => bail!("expected a JSON string (or an object with a \"text\" string)"),
        },
        _ => bail!("expected a JSON string (or an object with a \"text\" string)"),
    }
}

fn report(bytes: usize, tokens: usize, start: Instant) {
    let secs = start.elapsed().as_secs_f64().max(1e-9);
    eprintln_lossy!(
        "tokenized {bytes} bytes into {tokens} tokens in {:.3} s: {:.1} MB/s, {:.0} tokens/s",
        secs,
        bytes as f64 / secs / 1e6,
        tokens as f64 / secs
    );
}
