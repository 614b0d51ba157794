//! `infer logits MODEL --top-k K`: raw logits for fidelity checks against other implementations.
//!
//! Reads one JSON array of token ids per line from stdin, runs each sequence from an empty cache, and prints one
//! line per sequence: `{"top": [[[id, logit], ...] per position]}`, the K largest raw logits in descending order.

use anyhow::Context;
use clap::Args;

use crate::cli::args::ThreadArgs;
use crate::cli::input::{MAX_INPUT_BYTES, read_line};
use crate::cli::output::print_line;
use crate::model::{ForwardScratch, KvPool, Logits, SeqKv, SeqStep};

use super::EngineArgs;

#[derive(Args, Debug)]
pub struct LogitsArgs {
    /// Model: a .gguf path or a registry name (default: the registry's default model).
    pub model: Option<String>,
    /// How many of the largest logits to print per position.
    #[arg(long, default_value_t = 40, value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    pub top_k: u32,
    #[command(flatten)]
    pub threads: ThreadArgs,
    #[command(flatten)]
    pub engine: EngineArgs,
}

/// Tokens per forward pass: long sequences run in chunks of this many.
const CHUNK: usize = 512;

pub fn run(args: LogitsArgs) -> anyhow::Result<()> {
    let (_, model) = crate::cli::load_model(args.model.as_deref(), &args.engine)?;
    let pool = args.threads.build_pool().context("starting worker threads")?;
    let c = model.config.clone();
    let stdin = std::io::stdin();
    let mut scratch = ForwardScratch::new(&model);
    let mut kv_pool: Option<KvPool> = None;
    let top_k = (args.top_k as usize).min(c.n_vocab);
    let mut stdin = stdin.lock();
    for lineno in 1.. {
        let Some(line) = read_line(&mut stdin, MAX_INPUT_BYTES, lineno)? else { break };
        if line.trim_ascii().is_empty() {
            continue;
        }
        let ids: Vec<u32> = serde_json::from_slice(&line)
            .with_context(|| format!("stdin line {lineno}: expected a JSON array of token ids"))?;
        if let Some(&bad) = ids.iter().find(|&&t| t as usize >= c.n_vocab) {
            anyhow::bail!("stdin line {lineno}: token id {bad} is out of range (vocabulary has {} tokens)", c.n_vocab);
        }
        // One pool sized for the longest sequence so far; sequences run one at a time from an empty cache.
        let need = ids.len().max(1);
        if kv_pool.as_ref().is_none_or(|p| p.free_positions() < need) {
            let (dtype, cap) = (args.engine.kv_dtype(), need.max(CHUNK));
            dtype.check(&c)?;
            crate::memory::check_fits(
                &format!("stdin line {lineno} ({} tokens: its KV cache)", ids.len()),
                KvPool::bytes_for(&c, dtype, cap, cap, 0),
                "send shorter sequences",
            )?;
            kv_pool = Some(KvPool::new(&c, dtype, cap, cap));
        }
        let kv_pool = kv_pool.as_mut().expect("created above");
        let mut kv = SeqKv::new();
        let mut top: Vec<Vec<(u32, f32)>> = Vec::with_capacity(ids.len());
        let result = pool.install(|| -> anyhow::Result<()> {
            for chunk in ids.chunks(CHUNK) {
                let mut items = [SeqStep { tokens: chunk, kv: &mut kv, logits: Logits::All }];
                model.forward(&mut items, kv_pool, &mut scratch)?;
                for row in scratch.logits(0, c.n_vocab).chunks(c.n_vocab) {
                    top.push(top_k_of(row, top_k));
                }
            }
            Ok(())
        });
        kv_pool.release(&mut kv);
        result.with_context(|| format!("stdin line {lineno}"))?;
        let json = serde_json::json!({ "top": top.iter().map(|pos| pos.iter().map(|&(id, l)| serde_json::json!([id, l])).collect::<Vec<_>>()).collect::<Vec<_>>() });
        print_line(&json.to_string())?;
    }
    Ok(())
}

/// The `k` largest values of `row` with their indices, largest first (ties: lower index first).
pub fn top_k_of(row: &[f32], k: usize) -> Vec<(u32, f32)> {
    let mut idx: Vec<u32> = (0..row.len() as u32).collect();
    let cmp = |a: &u32, b: &u32| row[*b as usize].total_cmp(&row[*a as usize]).then(a.cmp(b));
    if k < idx.len() {
        idx.select_nth_unstable_by(k, cmp);
        idx.truncate(k);
    }
    idx.sort_by(cmp);
    idx.into_iter().map(|i| (i, row[i as usize])).collect()
}
