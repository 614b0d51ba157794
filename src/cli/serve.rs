//! `infer serve [MODEL]`: an OpenAI-compatible HTTP server over the batching engine.
//!
//! This module only parses flags, loads the model, starts the [`Engine`] and the axum app ([`crate::server`]), and
//! handles signals: on SIGINT or SIGTERM the server stops accepting connections, `/health` turns 503, running
//! requests finish (up to `--shutdown-timeout`), and the process exits 0.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use anyhow::Context;
use clap::Args;

use crate::cli::EngineArgs;
use crate::cli::args::{ThreadArgs, parse_count, parse_positive};
use crate::engine::{Engine, EngineConfig, KvBudget};
use crate::server::{AppState, LogFormat, ServerConfig, log};

#[derive(Args, Debug)]
pub struct ServeArgs {
    /// Model: a .gguf path or a registry name (default: the registry's default model, fetched on first use).
    pub model: Option<String>,
    /// Address to listen on.
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1")]
    pub host: String,
    /// Port to listen on (0 = any free port; the chosen one is printed).
    #[arg(long, value_name = "N", default_value_t = 8080)]
    pub port: u16,
    /// Model name reported by /v1/models and in responses [default: the registry name or the file's stem].
    #[arg(long, value_name = "NAME")]
    pub alias: Option<String>,
    /// Context per request in tokens (prompt and reply); 0 = the model's trained context.
    #[arg(short = 'c', long = "ctx-size", value_name = "N", default_value_t = 4096, value_parser = parse_count)]
    pub ctx_size: usize,
    /// Most requests in the batch at once (llama-server's -np).
    #[arg(long = "max-seqs", visible_alias = "parallel", short = 'P', value_name = "N", default_value_t = 16,
          value_parser = parse_positive)]
    pub max_seqs: usize,
    /// Most tokens per forward pass: every generating request's next token, then prompt chunks up to this (while
    /// requests are generating, at most 2 prompt tokens per generating request, at least 12).
    #[arg(long = "max-batch-tokens", value_name = "N", default_value_t = 256, value_parser = parse_positive)]
    pub max_batch_tokens: usize,
    /// Most requests waiting for a place in the batch; more get 429 with Retry-After.
    #[arg(long = "max-queue", value_name = "N", default_value_t = 256, value_parser = parse_count)]
    pub max_queue: usize,
    /// Memory for the shared KV cache, in bytes (suffixes K, M, G, as powers of 1024; e.g. 512M).
    #[arg(long = "kv-mem", value_name = "BYTES", default_value = "1G", value_parser = parse_bytes,
          conflicts_with = "kv_blocks")]
    pub kv_mem: usize,
    /// Size the KV cache in blocks of 16 positions instead of bytes.
    #[arg(long = "kv-blocks", value_name = "N", value_parser = parse_positive)]
    pub kv_blocks: Option<usize>,
    /// Do not share KV blocks between requests with a common prefix.
    #[arg(long)]
    pub no_prefix_cache: bool,
    /// Largest request body in bytes (413 beyond it).
    #[arg(long = "max-body", value_name = "BYTES", default_value = "4M", value_parser = parse_bytes)]
    pub max_body: usize,
    /// A Jinja chat template file, or a built-in name (chatml, gemma), instead of the model's own.
    #[arg(long = "chat-template", value_name = "FILE|NAME")]
    pub chat_template: Option<String>,
    /// Request log lines on stderr: text or JSON (one object per line).
    #[arg(long = "log-format", value_name = "FMT", default_value = "text", value_parser = ["text", "json"])]
    pub log_format: String,
    /// Print a line per engine step on stderr: the batch (decoding requests, prompt chunks), admissions with their
    /// prefix-cache hits, preemptions, forks, and the KV pool's used, shared, cached and evicted blocks. In the
    /// `--log-format`.
    #[arg(long)]
    pub trace: bool,
    /// Seconds to let running requests finish after SIGINT/SIGTERM before exiting anyway.
    #[arg(long = "shutdown-timeout", value_name = "SECS", default_value_t = 30)]
    pub shutdown_timeout: u64,
    #[command(flatten)]
    pub threads: ThreadArgs,
    #[command(flatten)]
    pub engine: EngineArgs,
}

/// `1073741824`, `512M`, `1G`, `1.5GiB`: a byte count with an optional binary suffix.
pub fn parse_bytes(text: &str) -> Result<usize, String> {
    let t = text.trim();
    let lower = t.to_ascii_lowercase();
    let digits = lower.trim_end_matches(['b', 'i']).trim_end();
    let (num, mult) = match digits.chars().last() {
        Some('k') => (&digits[..digits.len() - 1], 1u64 << 10),
        Some('m') => (&digits[..digits.len() - 1], 1 << 20),
        Some('g') => (&digits[..digits.len() - 1], 1 << 30),
        Some('t') => (&digits[..digits.len() - 1], 1 << 40),
        _ => (digits, 1),
    };
    let bad = || format!("'{text}' is not a size: expected bytes, optionally with K, M or G (e.g. 512M)");
    let value: f64 = num.trim().parse().map_err(|_| bad())?;
    if !value.is_finite() || value < 0.0 {
        return Err(bad());
    }
    let bytes = value * mult as f64;
    if bytes >= usize::MAX as f64 {
        return Err(format!("'{text}' is too large"));
    }
    Ok(bytes as usize)
}

pub fn run(args: ServeArgs) -> anyhow::Result<()> {
    let log_format = if args.log_format == "json" { LogFormat::Json } else { LogFormat::Text };
    let addr: SocketAddr = format!("{}:{}", args.host, args.port)
        .parse()
        .or_else(|_| {
            use std::net::ToSocketAddrs;
            (args.host.as_str(), args.port).to_socket_addrs().ok().and_then(|mut a| a.next()).ok_or(())
        })
        .map_err(|_| anyhow::anyhow!("--host {}: not an address this machine can listen on", args.host))?;

    let loaded = super::load(args.model.as_deref(), &args.engine)?;
    let model_name = args.alias.clone().unwrap_or_else(|| model_name(args.model.as_deref()));
    let template = match super::chat_template(&loaded.model, args.chat_template.as_deref()) {
        Ok(t) => Some(t),
        Err(e) if args.chat_template.is_some() => return Err(e),
        Err(e) => {
            log(&format!("note: no chat template ({e:#}); /v1/chat/completions will answer 400"));
            None
        }
    };
    // Requests name their own stop strings, so the server warns whatever they may say.
    let template_notes = template.as_ref().map_or_else(Vec::new, |t| {
        super::template_notes(&loaded.model, &loaded.tokenizer, args.chat_template.as_deref(), t, &[])
    });
    let n_ctx_train = loaded.model.config.n_ctx_train;
    let n_ctx = if args.ctx_size == 0 { n_ctx_train } else { args.ctx_size };
    let config = EngineConfig {
        n_ctx,
        max_seqs: args.max_seqs,
        max_batch_tokens: args.max_batch_tokens.max(args.max_seqs),
        max_queue: args.max_queue,
        kv: match args.kv_blocks {
            Some(n) => KvBudget::Blocks(n),
            None => KvBudget::Bytes(args.kv_mem),
        },
        kv_dtype: args.engine.kv_dtype(),
        prefix_cache: !args.no_prefix_cache,
        threads: args.threads.count(),
    };
    if args.max_batch_tokens < args.max_seqs {
        log(&format!(
            "note: --max-batch-tokens {} is below --max-seqs {}; using {} so every running request gets its token",
            args.max_batch_tokens, args.max_seqs, args.max_seqs
        ));
    }
    let model = Arc::new(loaded.model);
    let tokenizer = Arc::new(loaded.tokenizer);
    let observer = args.trace.then(|| crate::server::trace::observer(log_format));
    let engine =
        Arc::new(Engine::start_observed(model, tokenizer.clone(), config, observer).context("starting the engine")?);
    let plan = engine.pool_plan();
    log(&format!(
        "infer serve: {model_name} | {} threads ({}), {} | context {n_ctx} per request (trained {n_ctx_train}) | up to {} \
         requests, {} tokens per step",
        args.threads.count(),
        args.threads.reason(),
        super::isa_in_use(),
        args.max_seqs,
        engine.config().max_batch_tokens,
    ));
    let swa =
        if plan.swa_blocks > 0 { format!(" (+{} sliding-window blocks)", plan.swa_blocks) } else { String::new() };
    log(&format!(
        "KV cache: {} blocks of {} = {} tokens{swa}, {:.1} MiB {}; prefix cache {}",
        plan.blocks,
        plan.block_size,
        plan.tokens(),
        plan.bytes as f64 / (1 << 20) as f64,
        args.engine.kv_type,
        if args.no_prefix_cache { "off" } else { "on" },
    ));
    if plan.tokens() < n_ctx {
        log(&format!("note: the KV cache holds {} tokens, less than one request's context ({n_ctx})", plan.tokens()));
    }
    for note in &template_notes {
        log(note);
    }

    let state = AppState::new(
        engine.clone(),
        tokenizer,
        template,
        ServerConfig { model_name, max_body_bytes: args.max_body, log_format },
    );
    if state.tool_style != crate::tools::ToolStyle::Json {
        log(&format!("tools: the chat template lists them, and calls are {}", state.tool_style.calls_as()));
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("infer-http")
        .enable_all()
        .build()
        .context("starting the HTTP runtime")?;
    let deadline = Duration::from_secs(args.shutdown_timeout);
    runtime.block_on(serve(addr, state, deadline))?;
    // Every connection is closed: what the engine still has was cancelled by its client or cut off.
    drop(runtime);
    engine.shutdown();
    Ok(())
}

/// Binds, serves until a signal, then drains (up to `deadline`).
async fn serve(addr: SocketAddr, state: Arc<AppState>, deadline: Duration) -> anyhow::Result<()> {
    let listener = tokio::net::TcpListener::bind(addr).await.with_context(|| format!("listening on {addr}"))?;
    let local = listener.local_addr().context("reading the listening address")?;
    log(&format!("listening on http://{local} (OpenAI API at http://{local}/v1)"));
    let signalled = Arc::new(tokio::sync::Notify::new());
    let on_signal = {
        let (state, signalled) = (state.clone(), signalled.clone());
        async move {
            wait_for_signal().await;
            state.shutting_down.store(true, Ordering::SeqCst);
            let s = state.engine.stats();
            log(&format!(
                "shutting down: no new connections; {} running and {} waiting requests may take up to {}s",
                s.requests_running,
                s.requests_waiting,
                deadline.as_secs()
            ));
            signalled.notify_one();
        }
    };
    let app = crate::server::router(state.clone()).into_make_service_with_connect_info::<SocketAddr>();
    let server = axum::serve(listener, app).with_graceful_shutdown(on_signal);
    let cutoff = async {
        signalled.notified().await;
        tokio::select! {
            _ = tokio::time::sleep(deadline) => {}
            // A second signal: stop waiting.
            _ = wait_for_signal() => {}
        }
    };
    tokio::select! {
        result = server => result.context("serving HTTP")?,
        _ = cutoff => {
            let s = state.engine.stats();
            log(&format!("shutdown deadline passed: {} requests cut off", s.requests_running + s.requests_waiting));
        }
    }
    log("stopped");
    Ok(())
}

async fn wait_for_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        match (signal(SignalKind::interrupt()), signal(SignalKind::terminate())) {
            (Ok(mut int), Ok(mut term)) => {
                tokio::select! {
                    _ = int.recv() => {}
                    _ = term.recv() => {}
                }
            }
            _ => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}

/// The name a model is served under: a registry name as given, or a file's stem.
fn model_name(spec: Option<&str>) -> String {
    match spec {
        None => crate::registry::Registry::load()
            .map(|r| r.default_entry().name.clone())
            .unwrap_or_else(|_| "default".into()),
        Some(s) => {
            let p = std::path::Path::new(s);
            if p.is_file() {
                p.file_stem().map(|x| x.to_string_lossy().into_owned()).unwrap_or_else(|| s.to_string())
            } else {
                s.to_string()
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::parse_bytes;

    #[test]
    fn sizes_parse_with_binary_suffixes() {
        assert_eq!(parse_bytes("1024"), Ok(1024));
        assert_eq!(parse_bytes("512M"), Ok(512 << 20));
        assert_eq!(parse_bytes("1G"), Ok(1 << 30));
        assert_eq!(parse_bytes("1.5GiB"), Ok(3 << 29));
        assert_eq!(parse_bytes("64kb"), Ok(64 << 10));
        assert!(parse_bytes("lots").is_err());
        assert!(parse_bytes("-1G").is_err());
    }
}
