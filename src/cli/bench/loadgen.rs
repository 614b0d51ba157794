//! `infer bench --serve URL`: a load generator for any OpenAI-compatible server (`infer serve`, llama.cpp's
//! `llama-server`, vLLM), reporting what vLLM's serving benchmark reports.
//!
//! Every request streams (`stream: true`), so the client sees each token arrive:
//! - **TTFT**, time to first token: from sending the request to the first chunk with text;
//! - **ITL**, inter-token latency: the gaps between successive chunks with text;
//! - **TPOT**, time per output token: (E2EL − TTFT) / (output tokens − 1), per request;
//! - **E2EL**, end-to-end latency: from sending to the end of the stream.
//!
//! Output tokens are the server's `usage.completion_tokens` (asked for with `stream_options.include_usage`), or the
//! number of chunks with text if it reports none. Peak output throughput is the most chunks with text in any one
//! second. Each figure is given as mean, median, p90 and p99 (linear interpolation between ranks, as numpy does).
//!
//! Two ways to send load: a *concurrency sweep* (`--concurrency 1,4,16`: that many clients, each sending its next
//! request when the previous one ends), or a *Poisson rate* (`--rate R`: requests arrive R per second on average, at
//! exponentially distributed intervals, optionally capped at `--concurrency` in flight).
//!
//! Prompts come from a JSONL file or are synthetic: `--prompt-len` words drawn from common short English words (one
//! token each in the usual tokenizers; the report gives the server's own count), after an optional shared prefix of
//! `--shared-prefix` words, sent as the system message with `--endpoint chat`.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use clap::Args;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::Serialize;
use serde_json::{Value, json};

use crate::cli::args::{parse_count, parse_positive};
use crate::cli::output::{eprintln_lossy, print_line};

use super::report::md_table;

// Options of `bench --serve`. (A plain comment: a doc comment on a flattened `Args` struct would replace the
// `about` text of the command.)
#[derive(Args, Debug, Clone, Default)]
pub struct LoadArgs {
    /// Benchmark the OpenAI-compatible server at URL (e.g. http://127.0.0.1:8080) instead of running models.
    #[arg(long = "serve", value_name = "URL", help_heading = "Serving benchmark")]
    pub url: Option<String>,
    /// Concurrent clients, comma-separated (a run per value); with --rate, the most requests in flight.
    #[arg(long, value_name = "N,..", value_delimiter = ',', value_parser = parse_positive, requires = "url",
          help_heading = "Serving benchmark")]
    pub concurrency: Vec<usize>,
    /// Requests per second, arriving as a Poisson process, instead of a closed loop of clients.
    #[arg(long, value_name = "R", value_parser = parse_rate, requires = "url", help_heading = "Serving benchmark")]
    pub rate: Option<f64>,
    /// Requests per run [default: 4 per client, at least 16].
    #[arg(long = "num-prompts", value_name = "N", value_parser = parse_positive, requires = "url",
          help_heading = "Serving benchmark")]
    pub num_prompts: Option<usize>,
    /// Words in each synthetic prompt (about one token each).
    #[arg(long = "prompt-len", value_name = "N", default_value_t = 32, value_parser = parse_positive,
          help_heading = "Serving benchmark")]
    pub prompt_len: usize,
    /// Tokens to generate per request (max_tokens).
    #[arg(long = "gen-len", value_name = "N", default_value_t = 128, value_parser = parse_positive,
          help_heading = "Serving benchmark")]
    pub gen_len: usize,
    /// Words of a prefix every synthetic prompt shares (the system message with --endpoint chat).
    #[arg(long = "shared-prefix", value_name = "N", default_value_t = 0, value_parser = parse_count,
          help_heading = "Serving benchmark")]
    pub shared_prefix: usize,
    /// Prompts from a JSONL file, one per line: {"prompt": ...} or {"messages": [...]} (optionally with
    /// "max_tokens"), or a JSON string. Used in turn, as often as --num-prompts needs.
    #[arg(long = "prompts", value_name = "FILE", requires = "url", help_heading = "Serving benchmark")]
    pub prompts: Option<PathBuf>,
    /// The API to call.
    #[arg(long, value_name = "API", default_value = "completions", value_parser = ["completions", "chat"],
          help_heading = "Serving benchmark")]
    pub endpoint: String,
    /// Ask the server to ignore end-of-generation tokens, so every reply has --gen-len tokens.
    #[arg(long, requires = "url", help_heading = "Serving benchmark")]
    pub ignore_eos: bool,
    /// Sampling temperature sent with every request.
    #[arg(long = "temperature", value_name = "T", default_value_t = 0.0, help_heading = "Serving benchmark")]
    pub temperature: f32,
    /// Model name sent in requests [default: the first one the server's /v1/models lists].
    #[arg(long = "served-model", value_name = "NAME", requires = "url", help_heading = "Serving benchmark")]
    pub model: Option<String>,
    /// Requests sent before each run, not counted.
    #[arg(long = "warmup-requests", value_name = "N", default_value_t = 1, value_parser = parse_count,
          help_heading = "Serving benchmark")]
    pub warmup: usize,
    /// Seed of the synthetic prompts and the arrival times.
    #[arg(long = "seed", value_name = "N", default_value_t = 0, help_heading = "Serving benchmark")]
    pub seed: u64,
    /// A name for the server in the report (e.g. infer, llama-server).
    #[arg(long, value_name = "NAME", requires = "url", help_heading = "Serving benchmark")]
    pub label: Option<String>,
}

fn parse_rate(text: &str) -> Result<f64, String> {
    match text.trim().parse::<f64>() {
        Ok(r) if r.is_finite() && r > 0.0 => Ok(r),
        _ => Err(format!("'{text}' is not a rate: expected requests per second, a number > 0")),
    }
}

/// Mean, median, p90 and p99 of a set of values (milliseconds).
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct Summary {
    pub mean: f64,
    pub median: f64,
    pub p90: f64,
    pub p99: f64,
}

/// The `q`-th percentile (0..=100) of sorted values, interpolating linearly between ranks.
fn percentile(sorted: &[f64], q: f64) -> f64 {
    match sorted.len() {
        0 => 0.0,
        1 => sorted[0],
        n => {
            let rank = q / 100.0 * (n - 1) as f64;
            let (lo, frac) = (rank.floor() as usize, rank.fract());
            let hi = (lo + 1).min(n - 1);
            sorted[lo] + (sorted[hi] - sorted[lo]) * frac
        }
    }
}

fn summarize(values: &[f64]) -> Summary {
    if values.is_empty() {
        return Summary::default();
    }
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    Summary {
        mean: v.iter().sum::<f64>() / v.len() as f64,
        median: percentile(&v, 50.0),
        p90: percentile(&v, 90.0),
        p99: percentile(&v, 99.0),
    }
}

/// One run's results, as vLLM's serving benchmark names them.
#[derive(Debug, Clone, Serialize)]
pub struct ServeResult {
    pub label: String,
    pub url: String,
    pub endpoint: String,
    pub model: String,
    /// Clients (closed loop) or the cap on requests in flight (with a rate); `None`: uncapped.
    pub max_concurrency: Option<usize>,
    /// Requests per second (Poisson); `None`: as fast as the clients go.
    pub request_rate: Option<f64>,
    pub num_prompts: usize,
    pub completed: usize,
    pub failed: usize,
    pub duration_s: f64,
    pub total_input_tokens: usize,
    pub total_output_tokens: usize,
    pub request_throughput: f64,
    pub output_throughput: f64,
    pub total_token_throughput: f64,
    pub peak_output_throughput: f64,
    pub ttft_ms: Summary,
    pub tpot_ms: Summary,
    pub itl_ms: Summary,
    pub e2el_ms: Summary,
    pub first_error: Option<String>,
    pub input_lens: Vec<usize>,
    pub output_lens: Vec<usize>,
    pub ttfts_ms: Vec<f64>,
    pub e2els_ms: Vec<f64>,
}

/// What one request saw.
#[derive(Debug, Clone, Default)]
struct Outcome {
    error: Option<String>,
    prompt_tokens: usize,
    output_tokens: usize,
    ttft: f64,
    latency: f64,
    /// Gaps between chunks with text, seconds.
    itls: Vec<f64>,
    /// Arrival of each chunk with text, seconds since the run started.
    chunk_times: Vec<f64>,
}

/// The request bodies of a run (or of the warmup).
struct Prompts {
    bodies: Vec<Value>,
}

/// Common short English words: one token each (with their leading space) in the usual BPE and SentencePiece
/// vocabularies.
#[rustfmt::skip]
const WORDS: &[&str] = &[
    "the", "of", "and", "to", "in", "is", "was", "for", "on", "are", "with", "as", "at", "be", "this", "have",
    "from", "or", "one", "had", "by", "word", "but", "not", "what", "all", "were", "we", "when", "your", "can",
    "said", "there", "use", "an", "each", "which", "she", "do", "how", "their", "if", "will", "up", "other",
    "about", "out", "many", "then", "them", "these", "so", "some", "her", "would", "make", "like", "him", "into",
    "time", "has", "look", "two", "more", "write", "go", "see", "number", "no", "way", "could", "people", "my",
    "than", "first", "water", "been", "call", "who", "oil", "its", "now", "find", "long", "down", "day", "did",
    "get", "come", "made", "may", "part", "over", "new", "sound", "take", "only", "little", "work", "know", "place",
    "year", "live", "me", "back", "give", "most", "very", "after", "thing", "our", "just", "name", "good", "man",
    "think", "say", "great", "where", "help", "through", "much", "before", "line", "right", "too", "mean", "old",
    "any", "same", "tell", "boy", "follow", "came", "want", "show", "also", "around", "form", "three", "small",
    "set", "put", "end", "does", "another", "well", "large", "must", "big", "even", "such", "because", "turn",
    "here", "why", "ask", "went", "men", "read", "need", "land", "different", "home", "us", "move", "try", "kind",
    "hand", "picture", "again", "change", "off", "play", "spell", "air", "away", "animal", "house", "point", "page",
    "letter", "mother", "answer", "found", "study", "still", "learn", "should", "world", "high", "every", "near",
    "add", "food", "between", "own", "below", "country", "plant", "last", "school", "father", "keep", "tree",
    "never", "start", "city", "earth", "eye", "light", "thought", "head", "under", "story", "saw", "left", "few",
    "while", "along", "might", "close", "something", "seem", "next", "hard", "open", "example", "begin", "life",
    "always", "those",
];

fn words(rng: &mut ChaCha8Rng, n: usize) -> String {
    let mut out = String::with_capacity(n * 6);
    for i in 0..n {
        if i > 0 {
            out.push(' ');
        }
        out.push_str(WORDS[rng.random_range(0..WORDS.len())]);
    }
    out
}

impl Prompts {
    fn synthetic(args: &LoadArgs, chat: bool, n: usize, seed: u64) -> Prompts {
        let prefix = words(&mut ChaCha8Rng::seed_from_u64(args.seed ^ 0x05EE_D0F5_A4ED), args.shared_prefix);
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let bodies = (0..n)
            .map(|_| {
                let own = words(&mut rng, args.prompt_len);
                if chat {
                    let mut messages = Vec::new();
                    if !prefix.is_empty() {
                        messages.push(json!({"role": "system", "content": prefix}));
                    }
                    messages.push(json!({"role": "user", "content": own}));
                    json!({ "messages": messages })
                } else if prefix.is_empty() {
                    json!({ "prompt": own })
                } else {
                    json!({ "prompt": format!("{prefix} {own}") })
                }
            })
            .collect();
        Prompts { bodies }
    }

    fn from_file(path: &Path, chat: bool, n: usize) -> anyhow::Result<Prompts> {
        let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
        let mut lines = Vec::new();
        for (i, line) in text.lines().enumerate().filter(|(_, l)| !l.trim().is_empty()) {
            let at = || format!("{} line {}", path.display(), i + 1);
            let v: Value = serde_json::from_str(line).with_context(|| format!("{}: not JSON", at()))?;
            let body = match v {
                Value::String(s) if chat => json!({ "messages": [{"role": "user", "content": s}] }),
                Value::String(s) => json!({ "prompt": s }),
                Value::Object(o) if o.contains_key("messages") || o.contains_key("prompt") => {
                    match (chat, o.get("prompt"), o.get("messages")) {
                        (true, Some(Value::String(p)), None) => {
                            let mut o = o.clone();
                            o.remove("prompt");
                            o.insert("messages".into(), json!([{"role": "user", "content": p}]));
                            Value::Object(o)
                        }
                        (false, None, Some(_)) => bail!("{}: a chat conversation needs --endpoint chat", at()),
                        _ => Value::Object(o),
                    }
                }
                _ => bail!("{}: expected a string or an object with \"prompt\" or \"messages\"", at()),
            };
            lines.push(body);
        }
        if lines.is_empty() {
            bail!("{} has no prompts", path.display());
        }
        Ok(Prompts { bodies: (0..n).map(|i| lines[i % lines.len()].clone()).collect() })
    }
}

/// Fills in what every request sends besides its prompt.
fn finish_body(mut body: Value, args: &LoadArgs, model: &str) -> Value {
    let o = body.as_object_mut().expect("prompts are objects");
    o.insert("model".into(), json!(model));
    o.entry("max_tokens").or_insert(json!(args.gen_len));
    o.insert("temperature".into(), json!(args.temperature));
    o.insert("stream".into(), json!(true));
    o.insert("stream_options".into(), json!({"include_usage": true}));
    if args.ignore_eos {
        o.insert("ignore_eos".into(), json!(true));
    }
    body
}

fn agent() -> ureq::Agent {
    ureq::Agent::new_with_config(
        ureq::Agent::config_builder()
            .http_status_as_error(false)
            .timeout_connect(Some(Duration::from_secs(10)))
            .timeout_per_read(Some(Duration::from_secs(600)))
            .max_idle_connections_per_host(1024)
            .build(),
    )
}

/// Sends one streamed request and times its chunks.
fn send(agent: &ureq::Agent, url: &str, body: &Value, chat: bool, t0: Instant) -> Outcome {
    let mut out = Outcome::default();
    let start = Instant::now();
    let fail = |mut out: Outcome, e: String| {
        out.error = Some(e);
        out
    };
    let resp = match agent.post(url).header("content-type", "application/json").send(body.to_string().as_bytes()) {
        Ok(r) => r,
        Err(e) => return fail(out, format!("sending: {e}")),
    };
    let status = resp.status().as_u16();
    if status != 200 {
        let text = resp.into_body().read_to_string().unwrap_or_default();
        return fail(out, format!("HTTP {status}: {}", text.chars().take(300).collect::<String>()));
    }
    let reader = BufReader::new(resp.into_body().into_reader());
    let (mut last, mut chunks, mut done) = (None::<Instant>, 0usize, false);
    for line in reader.lines() {
        let line = match line {
            Ok(l) => l,
            Err(e) => return fail(out, format!("reading the stream: {e}")),
        };
        let Some(data) = line.strip_prefix("data:").map(str::trim) else { continue };
        if data == "[DONE]" {
            done = true;
            break;
        }
        let v: Value = match serde_json::from_str(data) {
            Ok(v) => v,
            Err(_) => {
                return fail(out, format!("not JSON in the stream: {}", data.chars().take(200).collect::<String>()));
            }
        };
        if let Some(e) = v.get("error") {
            return fail(out, format!("error in the stream: {e}"));
        }
        let choice = &v["choices"][0];
        let text = if chat { choice["delta"]["content"].as_str() } else { choice["text"].as_str() };
        if text.is_some_and(|t| !t.is_empty()) {
            let now = Instant::now();
            match last {
                None => out.ttft = (now - start).as_secs_f64(),
                Some(prev) => out.itls.push((now - prev).as_secs_f64()),
            }
            out.chunk_times.push((now - t0).as_secs_f64());
            last = Some(now);
            chunks += 1;
        }
        if let Some(u) = v.get("usage").filter(|u| u.is_object()) {
            out.prompt_tokens = u["prompt_tokens"].as_u64().unwrap_or(0) as usize;
            out.output_tokens = u["completion_tokens"].as_u64().unwrap_or(0) as usize;
        }
    }
    out.latency = start.elapsed().as_secs_f64();
    if !done {
        return fail(out, "the stream ended without [DONE]".into());
    }
    if out.output_tokens == 0 {
        out.output_tokens = chunks;
    }
    if chunks == 0 {
        return fail(out, "no text came back".into());
    }
    out
}

/// Runs `bodies` against the server with `concurrency` closed-loop clients, or at `rate` requests per second.
fn run_load(
    url: &str,
    bodies: &[Value],
    chat: bool,
    concurrency: Option<usize>,
    rate: Option<f64>,
    seed: u64,
) -> (Vec<Outcome>, f64) {
    let agent = agent();
    let results = Mutex::new(vec![Outcome::default(); bodies.len()]);
    let t0 = Instant::now();
    match rate {
        None => {
            let next = AtomicUsize::new(0);
            std::thread::scope(|s| {
                for _ in 0..concurrency.unwrap_or(1).min(bodies.len()) {
                    s.spawn(|| {
                        loop {
                            let i = next.fetch_add(1, Ordering::Relaxed);
                            let Some(body) = bodies.get(i) else { break };
                            let o = send(&agent, url, body, chat, t0);
                            results.lock().unwrap_or_else(|e| e.into_inner())[i] = o;
                        }
                    });
                }
            });
        }
        Some(rate) => {
            let mut rng = ChaCha8Rng::seed_from_u64(seed ^ 0xA771_7A15);
            let in_flight = (Mutex::new(0usize), Condvar::new());
            let cap = concurrency.unwrap_or(usize::MAX);
            std::thread::scope(|s| {
                let mut at = 0.0f64;
                for (i, body) in bodies.iter().enumerate() {
                    // Exponential gaps: a Poisson process of `rate` arrivals per second.
                    let u: f64 = rng.random_range(f64::EPSILON..1.0);
                    at += -u.ln() / rate;
                    let wait = Duration::from_secs_f64(at).saturating_sub(t0.elapsed());
                    std::thread::sleep(wait);
                    {
                        let (count, cv) = &in_flight;
                        let mut n = count.lock().unwrap_or_else(|e| e.into_inner());
                        while *n >= cap {
                            n = cv.wait(n).unwrap_or_else(|e| e.into_inner());
                        }
                        *n += 1;
                    }
                    let (agent, results, in_flight) = (&agent, &results, &in_flight);
                    s.spawn(move || {
                        let o = send(agent, url, body, chat, t0);
                        results.lock().unwrap_or_else(|e| e.into_inner())[i] = o;
                        let (count, cv) = in_flight;
                        *count.lock().unwrap_or_else(|e| e.into_inner()) -= 1;
                        cv.notify_one();
                    });
                }
            });
        }
    }
    let duration = t0.elapsed().as_secs_f64();
    (results.into_inner().unwrap_or_else(|e| e.into_inner()), duration)
}

fn result(
    args: &LoadArgs,
    model: &str,
    concurrency: Option<usize>,
    outcomes: &[Outcome],
    duration: f64,
) -> ServeResult {
    let ok: Vec<&Outcome> = outcomes.iter().filter(|o| o.error.is_none()).collect();
    let ms = |s: f64| s * 1e3;
    let ttfts: Vec<f64> = ok.iter().map(|o| ms(o.ttft)).collect();
    let e2els: Vec<f64> = ok.iter().map(|o| ms(o.latency)).collect();
    let itls: Vec<f64> = ok.iter().flat_map(|o| o.itls.iter().map(|&x| ms(x))).collect();
    let tpots: Vec<f64> = ok
        .iter()
        .filter(|o| o.output_tokens > 1)
        .map(|o| ms(o.latency - o.ttft) / (o.output_tokens - 1) as f64)
        .collect();
    let total_in: usize = ok.iter().map(|o| o.prompt_tokens).sum();
    let total_out: usize = ok.iter().map(|o| o.output_tokens).sum();
    let mut buckets = vec![0usize; duration.ceil().max(1.0) as usize + 1];
    let last = buckets.len() - 1;
    for t in ok.iter().flat_map(|o| &o.chunk_times) {
        buckets[(*t as usize).min(last)] += 1;
    }
    let per_s = |n: usize| if duration > 0.0 { n as f64 / duration } else { 0.0 };
    ServeResult {
        label: args.label.clone().unwrap_or_default(),
        url: args.url.clone().unwrap_or_default(),
        endpoint: args.endpoint.clone(),
        model: model.to_string(),
        max_concurrency: concurrency,
        request_rate: args.rate,
        num_prompts: outcomes.len(),
        completed: ok.len(),
        failed: outcomes.len() - ok.len(),
        duration_s: duration,
        total_input_tokens: total_in,
        total_output_tokens: total_out,
        request_throughput: per_s(ok.len()),
        output_throughput: per_s(total_out),
        total_token_throughput: per_s(total_in + total_out),
        peak_output_throughput: buckets.iter().copied().max().unwrap_or(0) as f64,
        ttft_ms: summarize(&ttfts),
        tpot_ms: summarize(&tpots),
        itl_ms: summarize(&itls),
        e2el_ms: summarize(&e2els),
        first_error: outcomes.iter().find_map(|o| o.error.clone()),
        input_lens: ok.iter().map(|o| o.prompt_tokens).collect(),
        output_lens: ok.iter().map(|o| o.output_tokens).collect(),
        ttfts_ms: ttfts,
        e2els_ms: e2els,
    }
}

/// The 50-column block vLLM's serving benchmark prints.
fn block(r: &ServeResult) -> String {
    let mut out = String::new();
    let mut line = |k: &str, v: String| out.push_str(&format!("{k:<40} {v:<10}\n"));
    let title = if r.label.is_empty() { " Serving Benchmark Result ".to_string() } else { format!(" {} ", r.label) };
    line(&format!("{title:=^50}"), String::new());
    line("Successful requests:", r.completed.to_string());
    if r.failed > 0 {
        line("Failed requests:", r.failed.to_string());
    }
    line("Maximum request concurrency:", r.max_concurrency.map_or("unlimited".into(), |c| c.to_string()));
    line("Request rate (req/s):", r.request_rate.map_or("inf".into(), |x| format!("{x:.2}")));
    line("Benchmark duration (s):", format!("{:.2}", r.duration_s));
    line("Total input tokens:", r.total_input_tokens.to_string());
    line("Total generated tokens:", r.total_output_tokens.to_string());
    line("Request throughput (req/s):", format!("{:.2}", r.request_throughput));
    line("Output token throughput (tok/s):", format!("{:.2}", r.output_throughput));
    line("Peak output token throughput (tok/s):", format!("{:.2}", r.peak_output_throughput));
    line("Total token throughput (tok/s):", format!("{:.2}", r.total_token_throughput));
    for (title, short, s) in [
        ("Time to First Token", "TTFT", &r.ttft_ms),
        ("Time per Output Token (excl. 1st token)", "TPOT", &r.tpot_ms),
        ("Inter-token Latency", "ITL", &r.itl_ms),
        ("End-to-end Latency", "E2EL", &r.e2el_ms),
    ] {
        line(&format!("{:-^50}", title), String::new());
        line(&format!("Mean {short} (ms):"), format!("{:.2}", s.mean));
        line(&format!("Median {short} (ms):"), format!("{:.2}", s.median));
        line(&format!("P90 {short} (ms):"), format!("{:.2}", s.p90));
        line(&format!("P99 {short} (ms):"), format!("{:.2}", s.p99));
    }
    line(&"=".repeat(50), String::new());
    if let Some(e) = &r.first_error {
        out.push_str(&format!("first error: {e}\n"));
    }
    out.lines().map(str::trim_end).collect::<Vec<_>>().join("\n")
}

/// The name of the first model the server lists.
fn served_model(base: &str) -> anyhow::Result<String> {
    let url = format!("{base}/v1/models");
    let resp = agent().get(&url).call().with_context(|| format!("connecting to {url}"))?;
    let status = resp.status().as_u16();
    let text = resp.into_body().read_to_string().with_context(|| format!("reading {url}"))?;
    if status != 200 {
        bail!("{url} answered HTTP {status}: {text}");
    }
    let v: Value = serde_json::from_str(&text).with_context(|| format!("{url} did not answer JSON"))?;
    v["data"][0]["id"].as_str().map(str::to_string).with_context(|| format!("{url} lists no model: {text}"))
}

pub fn run(args: &LoadArgs, output: &str) -> anyhow::Result<()> {
    let base = args.url.as_deref().expect("called with --serve").trim_end_matches('/');
    let base = base.strip_suffix("/v1").unwrap_or(base);
    if !base.starts_with("http://") {
        bail!("--serve {base}: expected an http:// URL such as http://127.0.0.1:8080");
    }
    if output == "csv" {
        bail!("-o csv is not available with --serve: use md, json or jsonl");
    }
    let chat = args.endpoint == "chat";
    let url = format!("{base}/v1/{}", if chat { "chat/completions" } else { "completions" });
    let model = match &args.model {
        Some(m) => m.clone(),
        None => served_model(base)?,
    };
    let runs: Vec<Option<usize>> = match (args.concurrency.as_slice(), args.rate) {
        ([], None) => vec![Some(1)],
        ([], Some(_)) => vec![None],
        (c, _) => c.iter().map(|&c| Some(c)).collect(),
    };
    let mut results = Vec::new();
    for (k, &concurrency) in runs.iter().enumerate() {
        let n = args.num_prompts.unwrap_or_else(|| (4 * concurrency.unwrap_or(4)).max(16));
        let seed = args.seed.wrapping_add(k as u64);
        let make = |n: usize, seed: u64| -> anyhow::Result<Prompts> {
            match &args.prompts {
                Some(p) => Prompts::from_file(p, chat, n),
                None => Ok(Prompts::synthetic(args, chat, n, seed)),
            }
        };
        let bodies: Vec<Value> = make(n, seed)?.bodies.into_iter().map(|b| finish_body(b, args, &model)).collect();
        if args.warmup > 0 {
            let warm: Vec<Value> =
                make(args.warmup, seed ^ 0x3A3A)?.bodies.into_iter().map(|b| finish_body(b, args, &model)).collect();
            let (w, _) = run_load(&url, &warm, chat, Some(1), None, seed);
            if let Some(e) = w.iter().find_map(|o| o.error.clone()) {
                bail!("the warmup request to {url} failed: {e}");
            }
        }
        eprintln_lossy!(
            "{}: {n} requests, {} ...",
            args.label.as_deref().unwrap_or(base),
            match (concurrency, args.rate) {
                (c, Some(r)) =>
                    format!("{r} req/s (Poisson), at most {} in flight", c.map_or("any".into(), |c| c.to_string())),
                (c, None) => format!("{} concurrent clients", c.unwrap_or(1)),
            }
        );
        let (outcomes, duration) = run_load(&url, &bodies, chat, concurrency, args.rate, seed);
        results.push(result(args, &model, concurrency, &outcomes, duration));
    }
    let text = match output {
        "json" => serde_json::to_string_pretty(&results)?,
        "jsonl" => results.iter().map(serde_json::to_string).collect::<Result<Vec<_>, _>>()?.join("\n"),
        _ => {
            let mut text: Vec<String> = results.iter().map(block).collect();
            if results.len() > 1 {
                text.push(summary_table(&results));
            }
            text.join("\n\n")
        }
    };
    print_line(&text)?;
    if let Some(r) = results.iter().find(|r| r.completed == 0) {
        bail!("no request succeeded: {}", r.first_error.as_deref().unwrap_or("unknown error"));
    }
    Ok(())
}

/// One row per run: the sweep at a glance.
fn summary_table(results: &[ServeResult]) -> String {
    let header = [
        "concurrency",
        "rate",
        "req/s",
        "output tok/s",
        "TTFT p50 ms",
        "TTFT p99 ms",
        "ITL p50 ms",
        "ITL p99 ms",
        "TPOT mean ms",
        "E2EL p50 ms",
    ];
    let rows: Vec<Vec<String>> = results
        .iter()
        .map(|r| {
            vec![
                r.max_concurrency.map_or("-".into(), |c| c.to_string()),
                r.request_rate.map_or("inf".into(), |x| format!("{x:.2}")),
                format!("{:.2}", r.request_throughput),
                format!("{:.1}", r.output_throughput),
                format!("{:.1}", r.ttft_ms.median),
                format!("{:.1}", r.ttft_ms.p99),
                format!("{:.1}", r.itl_ms.median),
                format!("{:.1}", r.itl_ms.p99),
                format!("{:.1}", r.tpot_ms.mean),
                format!("{:.1}", r.e2el_ms.median),
            ]
        })
        .collect();
    md_table(&header, &[true; 10], &rows)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_interpolate_like_numpy() {
        let v = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0];
        assert_eq!(percentile(&v, 50.0), 5.5);
        assert!((percentile(&v, 90.0) - 9.1).abs() < 1e-12);
        assert!((percentile(&v, 99.0) - 9.91).abs() < 1e-12);
        assert_eq!(percentile(&[3.0], 99.0), 3.0);
        let s = summarize(&[4.0, 1.0, 3.0, 2.0]);
        assert_eq!((s.mean, s.median), (2.5, 2.5));
    }
}
