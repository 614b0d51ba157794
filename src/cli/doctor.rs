//! `infer doctor MODEL`: the checks of [`crate::doctor`], printed as a report (or JSON), with a non-zero exit status
//! when one fails.

use std::path::{Path, PathBuf};

use anyhow::Context;
use clap::Args;

use crate::cli::args::ThreadArgs;
use crate::cli::output::print_line;
use crate::doctor::{Options, Report, Status};
use crate::gguf::GgufFile;

#[derive(Args, Debug)]
pub struct DoctorArgs {
    /// Model: a .gguf path or a registry name (default: the registry's default model).
    pub model: Option<String>,
    /// Print one JSON object instead of the report.
    #[arg(long)]
    pub json: bool,
    /// Check the metadata only: do not load the weights or run the model.
    #[arg(long)]
    pub no_forward: bool,
    /// Check this chat template instead of the model's own: a template file, or a built-in's name (chatml, gemma).
    #[arg(long, value_name = "TEMPLATE")]
    pub chat_template: Option<String>,
    /// The Hugging Face tokenizer.json the model was converted from [default: tokenizer.json beside the model].
    #[arg(long, value_name = "FILE")]
    pub tokenizer_json: Option<PathBuf>,
    /// The Hugging Face tokenizer_config.json [default: tokenizer_config.json beside the model].
    #[arg(long, value_name = "FILE")]
    pub tokenizer_config: Option<PathBuf>,
    /// Exit non-zero on warnings too, not only on failures.
    #[arg(long)]
    pub strict: bool,
    #[command(flatten)]
    pub threads: ThreadArgs,
}

/// A file given by flag, or the one of that name beside the model if there is one. A flag naming a missing file is
/// an error here, before any check runs.
fn hf_file(flag: Option<&Path>, flag_name: &str, model: &Path, default_name: &str) -> anyhow::Result<Option<PathBuf>> {
    match flag {
        Some(p) if p.is_file() => Ok(Some(p.to_path_buf())),
        Some(p) => anyhow::bail!("{flag_name}: no such file: {}", p.display()),
        None => Ok(model.parent().map(|dir| dir.join(default_name)).filter(|p| p.is_file())),
    }
}

pub fn run(args: DoctorArgs) -> anyhow::Result<()> {
    infer_kernels::dispatch::try_isa().context("INFER_ISA")?;
    let path = crate::cli::resolve_model_arg(args.model.as_deref())?;
    let opts = Options {
        forward: !args.no_forward,
        template_override: crate::cli::chat_template_source(args.chat_template.as_deref())?,
        tokenizer_json: hf_file(args.tokenizer_json.as_deref(), "--tokenizer-json", &path, "tokenizer.json")?,
        tokenizer_config: hf_file(
            args.tokenizer_config.as_deref(),
            "--tokenizer-config",
            &path,
            "tokenizer_config.json",
        )?,
        render_limits: None,
    };
    let file = std::sync::Arc::new(GgufFile::open(&path).with_context(|| format!("reading {}", path.display()))?);
    let cancel = crate::cli::cancel_on_ctrl_c();
    let report = args.threads.install(|| crate::doctor::examine(&file, &opts, &cancel))?;
    if cancel.load(std::sync::atomic::Ordering::SeqCst) {
        return Err(crate::cli::Interrupted.into());
    }
    if args.json {
        let mut json = serde_json::to_value(&report)?;
        json["file"] = path.display().to_string().into();
        json["ok"] = verdict(&report, args.strict).is_ok().into();
        print_line(&serde_json::to_string_pretty(&json)?)?;
    } else {
        print_line(&render(&path, &report))?;
    }
    verdict(&report, args.strict)
}

/// Failures (and, with `--strict`, warnings) make the command fail.
fn verdict(report: &Report, strict: bool) -> anyhow::Result<()> {
    let (failed, warned) = (report.count(Status::Fail), report.count(Status::Warn));
    if failed > 0 {
        anyhow::bail!("{failed} check{} failed", if failed == 1 { "" } else { "s" });
    }
    if strict && warned > 0 {
        anyhow::bail!("{warned} check{} warned (--strict)", if warned == 1 { "" } else { "s" });
    }
    Ok(())
}

/// The report: one line per check, its details indented beneath, then the sample conversation and a tally.
fn render(path: &Path, report: &Report) -> String {
    use std::fmt::Write;
    let mut out = String::new();
    let _ = writeln!(out, "infer doctor: {}\n", path.display());
    let width = report.checks.iter().map(|c| c.name.len()).max().unwrap_or(0);
    for c in &report.checks {
        let _ = writeln!(out, "{:<4}  {:<width$}  {}", c.status.as_str(), c.name, c.summary);
        for d in &c.details {
            let _ = writeln!(out, "{:<4}  {:<width$}    {d}", "", "");
        }
    }
    if let Some(sample) = &report.sample {
        let _ = writeln!(out, "\nThe sample conversation as the chat template renders it (with the reply opened):");
        for line in sample.split('\n') {
            let _ = writeln!(out, "  | {}", line.escape_debug());
        }
    }
    let _ = write!(
        out,
        "\n{} ok, {} warning{}, {} failed, {} skipped",
        report.count(Status::Ok),
        report.count(Status::Warn),
        if report.count(Status::Warn) == 1 { "" } else { "s" },
        report.count(Status::Fail),
        report.count(Status::Skip),
    );
    out
}
