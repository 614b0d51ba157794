//! `infer bench [MODEL...]`: speed of prefill (`pp<N>`), single-sequence decode (`tg<N>`) and batched decode (the
//! `--batch` curve), in the style of llama-bench and llama-batched-bench.
//!
//! Token ids are random (seeded): tokenization is not part of what is timed, and in pp/tg neither is choosing the
//! next token. Every test runs once untimed (warmup), then `-r` timed repetitions; rates are reported as the mean
//! ± the sample standard deviation of the per-repetition rates.
//!
//! - `pp<N>`: one prompt of N tokens through an empty cache, in forward calls of at most `--ubatch` tokens.
//! - `tg<N>`: N single-token forward calls from an empty cache, each computing the logits of its token.
//! - `-d D` (depth, as llama-bench has it): `pp<N> @ d<D>` and `tg<N> @ d<D>` run the same after an untimed prefill
//!   of D random tokens, so they measure attention over a cache of D positions.
//! - `--batch B,...`: B requests of random prompts through the serving engine ([`crate::engine`]), which holds their
//!   KV tables in one shared paged pool. The first step prefills all B prompts together, then every step decodes one
//!   token for each of the B sequences. S_PP = B·PP/T_PP and S_TG = B·TG/T_TG are aggregate rates. Unlike pp/tg,
//!   these steps include the engine's own work: scheduling, choosing each sequence's next token (greedy) and
//!   streaming its text, which is what a server pays too.
//! - `--serve URL`: a load generator against an OpenAI-compatible server (see [`loadgen`]).
mod loadgen;
mod plot;
mod report;
mod runner;

use std::path::PathBuf;

use clap::Args;

use crate::cli::args::{parse_count, parse_threads};

use super::EngineArgs;

pub use report::{CurvePoint, Record};

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
    /// Thread counts to test, comma-separated [default: one per physical core this process may use, as `infer info`
    /// says].
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
    /// Also probe the memory read rate at each thread count, before the tests and after each one, and report the best
    /// (decode's limit is that rate over the model's bytes).
    #[arg(long)]
    pub bandwidth: bool,
    /// Also probe the kernel level's f32 FMA and integer multiply-add peaks at each thread count, and state each
    /// pp result as a share of the one its weights use (a prompt's matrix products cannot go faster).
    #[arg(long)]
    pub peak: bool,
    /// Also draw the results as a chart: FILE.svg or FILE.png.
    #[arg(long, value_name = "FILE")]
    pub plot: Option<PathBuf>,
    #[command(flatten)]
    pub engine: EngineArgs,
    #[command(flatten)]
    pub load: loadgen::LoadArgs,
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

pub fn run(args: BenchArgs) -> anyhow::Result<()> {
    if let Some(url) = &args.load.url {
        let model_flags = !args.models.is_empty()
            || !args.n_prompt.is_empty()
            || !args.n_gen.is_empty()
            || !args.batch.is_empty()
            || args.plot.is_some();
        if model_flags {
            anyhow::bail!("--serve {url} measures a server: MODEL, -p, -n, --batch and --plot do not apply");
        }
        return loadgen::run(&args.load, &args.output);
    }
    runner::run(args)
}
