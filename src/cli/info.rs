//! `infer info MODEL [--json]`: what is in a GGUF file, and which SIMD level this CPU runs.

use anyhow::Context;
use clap::Args;
use serde_json::json;

use crate::cli::output::print_line;
use crate::cpu_topology::{CpuTopology, cpu_quota};
use crate::gguf::{GgufFile, MetaValue};

#[derive(Args, Debug)]
pub struct InfoArgs {
    /// Model: a .gguf path or a registry name (default: the registry's default model).
    pub model: Option<String>,
    /// Print one JSON object instead of the human-readable report.
    #[arg(long)]
    pub json: bool,
    /// Show every element of long arrays (tokenizer vocabularies can hold 262k entries).
    #[arg(long)]
    pub full: bool,
}

/// Arrays longer than this are summarised in the report and in JSON (unless `--full`).
const ARRAY_PREVIEW: usize = 8;

pub fn run(args: InfoArgs) -> anyhow::Result<()> {
    // The report names the kernel level in use, so a level that cannot be used is an error here as everywhere.
    infer_kernels::dispatch::try_isa().context("INFER_ISA")?;
    let path = crate::cli::resolve_model_arg(args.model.as_deref())?;
    let file = GgufFile::open(&path).with_context(|| format!("reading {}", path.display()))?;
    let summary = ModelSummary::of(&file);
    if args.json {
        print_line(&serde_json::to_string_pretty(&to_json(&file, &summary, args.full))?)?;
    } else {
        print_report(&file, &summary, args.full)?;
    }
    Ok(())
}

/// The headline facts, read leniently: `info` must describe even a file whose metadata is incomplete.
struct ModelSummary {
    architecture: String,
    name: String,
    file_type: String,
    context_length: Option<u64>,
    parameters: u64,
}

impl ModelSummary {
    fn of(file: &GgufFile) -> ModelSummary {
        let meta = file.metadata();
        let architecture = meta.get("general.architecture").and_then(MetaValue::as_str).unwrap_or("unknown");
        let name = meta.get("general.name").and_then(MetaValue::as_str).unwrap_or("").to_string();
        let file_type = match meta.get("general.file_type").and_then(MetaValue::as_u64) {
            Some(ft) => file_type_name(ft).map(str::to_string).unwrap_or_else(|| format!("unknown ({ft})")),
            None => "unknown".to_string(),
        };
        let context_length = meta.get(&format!("{architecture}.context_length")).and_then(MetaValue::as_u64);
        ModelSummary {
            architecture: architecture.to_string(),
            name,
            file_type,
            context_length,
            parameters: file.parameter_count(),
        }
    }
}

/// llama.cpp's `llama_ftype` names for `general.file_type`.
pub fn file_type_name(ft: u64) -> Option<&'static str> {
    Some(match ft {
        0 => "F32",
        1 => "F16",
        2 => "Q4_0",
        3 => "Q4_1",
        7 => "Q8_0",
        8 => "Q5_0",
        9 => "Q5_1",
        10 => "Q2_K",
        11 => "Q3_K_S",
        12 => "Q3_K_M",
        13 => "Q3_K_L",
        14 => "Q4_K_S",
        15 => "Q4_K_M",
        16 => "Q5_K_S",
        17 => "Q5_K_M",
        18 => "Q6_K",
        19 => "IQ2_XXS",
        20 => "IQ2_XS",
        21 => "Q2_K_S",
        22 => "IQ3_XS",
        23 => "IQ3_XXS",
        24 => "IQ1_S",
        25 => "IQ4_NL",
        26 => "IQ3_S",
        27 => "IQ3_M",
        28 => "IQ2_S",
        29 => "IQ2_M",
        30 => "IQ4_XS",
        31 => "IQ1_M",
        32 => "BF16",
        36 => "TQ1_0",
        37 => "TQ2_0",
        38 => "MXFP4_MOE",
        _ => return None,
    })
}

/// "97.9 MiB": byte sizes (the library's own spelling, which its memory errors use too).
pub fn human_bytes(n: u64) -> String {
    crate::memory::bytes(n)
}

fn print_report(file: &GgufFile, s: &ModelSummary, full: bool) -> anyhow::Result<()> {
    let mut out = String::new();
    use std::fmt::Write;
    writeln!(out, "file:          {}", file.path().display())?;
    writeln!(out, "gguf version:  {}", file.version())?;
    writeln!(out, "architecture:  {}", s.architecture)?;
    if !s.name.is_empty() {
        writeln!(out, "name:          {}", s.name)?;
    }
    writeln!(out, "parameters:    {} ({})", crate::memory::count(s.parameters), s.parameters)?;
    writeln!(out, "file type:     {}", s.file_type)?;
    writeln!(out, "size:          {} ({} bytes)", human_bytes(file.file_len()), file.file_len())?;
    match s.context_length {
        Some(n) => writeln!(out, "context:       {n}")?,
        None => writeln!(out, "context:       unknown")?,
    }
    writeln!(out, "tensors:       {}", file.tensors().len())?;
    writeln!(out, "simd:          {}", simd_line())?;
    writeln!(out, "cpus:          {}", cpus_line())?;
    writeln!(out)?;
    writeln!(out, "metadata ({} keys):", file.metadata().len())?;
    let preview = if full { usize::MAX } else { ARRAY_PREVIEW };
    for (key, value) in file.metadata().iter() {
        writeln!(out, "  {key:<44} {:<14} {}", value.type_name(), value.summary(preview))?;
    }
    writeln!(out)?;
    writeln!(out, "  {:<4} {:<36} {:<7} {:<22} {:>12}", "#", "tensor", "type", "shape", "size")?;
    for (i, t) in file.tensors().iter().enumerate() {
        let shape = format!("{:?}", t.dims);
        writeln!(out, "  {i:<4} {:<36} {:<7} {shape:<22} {:>12}", t.name, t.ty.name(), human_bytes(t.n_bytes))?;
    }
    crate::cli::output::print_flush(&out)?;
    Ok(())
}

fn to_json(file: &GgufFile, s: &ModelSummary, full: bool) -> serde_json::Value {
    let metadata: serde_json::Map<String, serde_json::Value> = file
        .metadata()
        .iter()
        .map(|(k, v)| {
            let value = match v {
                MetaValue::Array(a) if !full && a.len() > ARRAY_PREVIEW => json!({
                    "type": v.type_name(),
                    "len": a.len(),
                    "head": summarise_array_head(v),
                }),
                _ => v.to_json(),
            };
            (k.to_string(), value)
        })
        .collect();
    let tensors: Vec<serde_json::Value> = file
        .tensors()
        .iter()
        .map(|t| {
            json!({
                "name": t.name,
                "type": t.ty.name(),
                "shape": t.dims,
                "offset": file.data_offset() + t.offset,
                "bytes": t.n_bytes,
            })
        })
        .collect();
    json!({
        "path": file.path().display().to_string(),
        "version": file.version(),
        "architecture": s.architecture,
        "name": s.name,
        "file_type": s.file_type,
        "parameters": s.parameters,
        "context_length": s.context_length,
        "file_size": file.file_len(),
        "simd": simd_json(),
        "cpus": CpuTopology::detect().to_json(cpu_quota()),
        "metadata": metadata,
        "tensors": tensors,
    })
}

fn summarise_array_head(v: &MetaValue) -> serde_json::Value {
    match v.to_json() {
        serde_json::Value::Array(items) => serde_json::Value::Array(items.into_iter().take(ARRAY_PREVIEW).collect()),
        other => other,
    }
}

/// What the CPU offers and what the kernels will use.
pub fn simd_line() -> String {
    let offered = crate::cli::cpu_features().join(" ");
    let l1d = infer_kernels::dispatch::l1d_bytes().map(|b| format!("; L1D {} KB", b / 1024)).unwrap_or_default();
    let l3 = infer_kernels::dispatch::l3_bytes().map(|b| format!(", L3 {} MB", b >> 20)).unwrap_or_default();
    format!("{} (cpu: {offered}{l1d}{l3})", crate::cli::isa_in_use())
}

/// The usable CPUs and the default thread count: `2 cores, 1 NUMA node; 2 threads by default (one per core)`.
pub fn cpus_line() -> String {
    let topology = CpuTopology::detect();
    let quota = cpu_quota();
    let choice = topology.default_threads(quota);
    let capped = if quota < topology.usable_cpus() { format!("; a CPU quota of {quota}") } else { String::new() };
    let n = choice.threads;
    let plural = if n == 1 { "" } else { "s" };
    format!("{}{capped}; {n} thread{plural} by default ({})", topology.describe(), choice.reason)
}

fn simd_json() -> serde_json::Value {
    json!({
        "in_use": crate::cli::isa_in_use(),
        "cpu": crate::cli::cpu_features(),
        "l1d_bytes": infer_kernels::dispatch::l1d_bytes(),
        "l3_bytes": infer_kernels::dispatch::l3_bytes(),
    })
}
