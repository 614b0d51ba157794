//! The HTTP side of `infer serve`: an OpenAI-compatible API over the [`Engine`], on axum.
//!
//! - `POST /v1/completions`, `POST /v1/chat/completions` (with `stream: true`: server-sent events ending in
//!   `data: [DONE]`);
//! - `GET /v1/models`, `GET /health` (503 while shutting down, so a load balancer stops sending);
//! - `GET /metrics` (Prometheus text: the engine's gauges, counters and latency histograms, see [`metrics`]);
//! - `POST /tokenize` (`{"content": ...}` or `{"messages": [...]}`): the token ids, and the stable hashes of the
//!   prompt's full KV blocks, which a prefix-affinity router can compare with other requests'.
//!
//! Bad requests get a 4xx with an OpenAI-style error body: 400 for malformed JSON, wrong types, bad values and
//! prompts longer than the context; 413 for a body over the limit; 429 with `Retry-After` when the engine's queue is
//! full. One log line per request goes to stderr when it ends, as text or JSON.

pub mod metrics;
pub mod openai;
pub mod trace;

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use axum::Router;
use axum::body::Body;
use axum::extract::{ConnectInfo, Request as HttpRequest, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, Uri, header};
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde_json::{Value, json};

use crate::engine::prefix_cache::prefix_hashes;
use crate::engine::{Engine, Event, FinishReason, Request, RequestError, RequestStream, Usage};
use crate::model::kv_cache::DEFAULT_BLOCK_SIZE;
use crate::sampling::SamplingError;
use crate::tokenizer::Tokenizer;
use crate::tokenizer::chat::ChatTemplate;
use crate::tools::{CallReader, ReplyPiece, ToolCall, ToolStyle, ToolUse};

use openai::{ApiError, GenerationRequest, Prompt, ResponseMeta, TokenLogprobs};

/// How request log lines are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogFormat {
    Text,
    Json,
}

/// Settings of the HTTP side.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// The name `/v1/models` reports and responses carry.
    pub model_name: String,
    /// Largest request body accepted, in bytes (413 beyond it).
    pub max_body_bytes: usize,
    pub log_format: LogFormat,
}

/// What every handler shares.
pub struct AppState {
    pub engine: Arc<Engine>,
    pub tokenizer: Arc<Tokenizer>,
    /// The chat template (`None`: the chat endpoint answers 400).
    pub template: Option<ChatTemplate>,
    /// How the template has the model call tools.
    pub tool_style: ToolStyle,
    pub config: ServerConfig,
    /// Set when a shutdown signal arrives: `/health` turns 503.
    pub shutting_down: AtomicBool,
    pub started: u64,
    pub http: metrics::HttpCounters,
}

impl AppState {
    pub fn new(
        engine: Arc<Engine>,
        tokenizer: Arc<Tokenizer>,
        template: Option<ChatTemplate>,
        config: ServerConfig,
    ) -> Arc<AppState> {
        let tool_style = template.as_ref().map_or(ToolStyle::Json, |t| ToolStyle::of_template(t.source()));
        Arc::new(AppState {
            engine,
            tokenizer,
            template,
            tool_style,
            config,
            shutting_down: AtomicBool::new(false),
            started: unix_now(),
            http: metrics::HttpCounters::default(),
        })
    }
}

fn unix_now() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

/// The application: every route, with JSON 404 and 405 answers for the rest.
pub fn router(state: Arc<AppState>) -> Router {
    Router::new()
        .route("/v1/completions", post(completions))
        .route("/v1/chat/completions", post(chat_completions))
        .route("/v1/models", get(models))
        .route("/health", get(health))
        .route("/metrics", get(metrics_handler))
        .route("/tokenize", post(tokenize))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .with_state(state)
}

/// What one request's log line says; filled in as the request goes, and written when it is dropped, so that every
/// request gets exactly one line, also when its client goes away mid-way.
struct LogLine {
    state: Arc<AppState>,
    remote: Option<SocketAddr>,
    method: Method,
    path: String,
    status: u16,
    start: Instant,
    id: Option<String>,
    stream: bool,
    usage: Option<Usage>,
    /// From the request's arrival (tokenizing included) to its first generated token.
    ttft: Option<Duration>,
    finish: Option<&'static str>,
    error: Option<String>,
    /// Choices the request asked for (`n`).
    choices: usize,
}

impl LogLine {
    fn new(state: &Arc<AppState>, remote: Option<SocketAddr>, method: Method, uri: &Uri) -> LogLine {
        LogLine {
            state: state.clone(),
            remote,
            method,
            path: uri.path().to_string(),
            status: 200,
            start: Instant::now(),
            id: None,
            stream: false,
            usage: None,
            ttft: None,
            finish: None,
            error: None,
            choices: 1,
        }
    }

    fn write(&mut self) {
        // A generation whose client left before the end: 499 (nginx's "client closed request") if no response had
        // started, else the stream's 200, and `cancelled` either way.
        if self.id.is_some() && self.finish.is_none() && self.error.is_none() {
            self.finish = Some(FinishReason::Cancelled.as_str());
            if !self.stream {
                self.status = 499;
            }
        }
        let state = &*self.state;
        state.http.count(self.status);
        let total_ms = self.start.elapsed().as_secs_f64() * 1e3;
        let ttft_ms = self.ttft.map(|t| t.as_secs_f64() * 1e3);
        let ts = timestamp();
        let remote = self.remote.map(|r| r.to_string()).unwrap_or_else(|| "-".into());
        let line = match state.config.log_format {
            LogFormat::Json => json!({
                "ts": ts,
                "remote": remote,
                "method": self.method.as_str(),
                "path": self.path,
                "status": self.status,
                "id": self.id,
                "stream": self.stream,
                "prompt_tokens": self.usage.map(|u| u.prompt_tokens),
                "cached_tokens": self.usage.map(|u| u.cached_tokens),
                "completion_tokens": self.usage.map(|u| u.completion_tokens),
                "ttft_ms": ttft_ms,
                "total_ms": total_ms,
                "finish_reason": self.finish,
                "n": self.choices,
                "error": self.error,
            })
            .to_string(),
            LogFormat::Text => {
                let mut s = format!("{ts} {remote} {} {} {}", self.method, self.path, self.status);
                if let Some(u) = &self.usage {
                    s += &format!(
                        " prompt={} cached={} completion={}",
                        u.prompt_tokens, u.cached_tokens, u.completion_tokens
                    );
                }
                if let Some(t) = ttft_ms {
                    s += &format!(" ttft={t:.1}ms");
                }
                s += &format!(" total={total_ms:.1}ms");
                if let Some(f) = self.finish {
                    s += &format!(" finish={f}");
                }
                if self.choices > 1 {
                    s += &format!(" n={}", self.choices);
                }
                if self.stream {
                    s += " stream";
                }
                if let Some(id) = &self.id {
                    s += &format!(" id={id}");
                }
                if let Some(e) = &self.error {
                    s += &format!(" error={e:?}");
                }
                s
            }
        };
        log(&line);
    }
}

/// Now, as the log lines write it (UTC, milliseconds).
fn timestamp() -> String {
    let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default();
    format!(
        "{}.{:03}Z",
        crate::tokenizer::chat::strftime("%Y-%m-%dT%H:%M:%S", now.as_secs() as i64),
        now.subsec_millis()
    )
}

/// Writes one line to stderr, the server's log. When stderr is a closed pipe (its reader went away) the line is
/// lost, not the request: `eprintln!` panics on a failed write, which dropped every connection unanswered and made
/// the shutdown exit 101.
pub fn log(line: &str) {
    use std::io::Write;
    let _ = writeln!(std::io::stderr().lock(), "{line}");
}

impl Drop for LogLine {
    fn drop(&mut self) {
        self.write();
    }
}

fn error_response(e: &ApiError) -> Response {
    let status = StatusCode::from_u16(e.status).unwrap_or(StatusCode::BAD_REQUEST);
    let mut resp = (status, axum::Json(e.body())).into_response();
    if e.status == 429 {
        resp.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
    }
    resp
}

/// Answers with `e` (the request's log line goes with it).
fn fail(mut log: LogLine, e: ApiError) -> Response {
    log.status = e.status;
    log.error = Some(e.message.clone());
    error_response(&e)
}

/// Reads the whole body, refusing (413) more than `limit` bytes.
async fn read_body(headers: &HeaderMap, body: Body, limit: usize) -> Result<axum::body::Bytes, ApiError> {
    let too_big = || ApiError::new(413, format!("the request body is larger than the {limit}-byte limit"));
    let declared = headers.get(header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()).and_then(|v| v.parse().ok());
    if declared.is_some_and(|n: usize| n > limit) {
        return Err(too_big());
    }
    axum::body::to_bytes(body, limit).await.map_err(|e| {
        let length_limit = std::error::Error::source(&e)
            .is_some_and(|s| s.downcast_ref::<http_body_util::LengthLimitError>().is_some());
        if length_limit { too_big() } else { ApiError::new(400, format!("reading the request body: {e}")) }
    })
}

/// The request's log line (from its method, path and peer address) and its parts.
fn start(state: &Arc<AppState>, req: HttpRequest) -> (LogLine, HeaderMap, Body) {
    let (parts, body) = req.into_parts();
    let remote = parts.extensions.get::<ConnectInfo<SocketAddr>>().map(|c| c.0);
    (LogLine::new(state, remote, parts.method, &parts.uri), parts.headers, body)
}

async fn completions(State(state): State<Arc<AppState>>, req: HttpRequest) -> Response {
    generate(state, req, false).await
}

async fn chat_completions(State(state): State<Arc<AppState>>, req: HttpRequest) -> Response {
    generate(state, req, true).await
}

/// Turns a prompt into token ids (rendering the chat template for a conversation, with the tools where the
/// template lists them).
fn encode(state: &AppState, prompt: &Prompt, tools: Option<&ToolUse>) -> Result<Vec<u32>, ApiError> {
    let tok = &state.tokenizer;
    match prompt {
        Prompt::Text(text) => Ok(tok.encode(text, true, true)),
        Prompt::Tokens(ids) => Ok(ids.clone()),
        Prompt::Chat(messages) => {
            let template = state
                .template
                .as_ref()
                .ok_or_else(|| ApiError::new(400, "this model has no chat template: use /v1/completions"))?;
            let rendered = template.render_with_tools(messages, tools.and_then(ToolUse::template_tools), true);
            let rendered = rendered.map_err(|e| {
                ApiError::bad("messages", format!("the chat template could not render these messages: {e}"))
            })?;
            Ok(tok.encode_prompt(&rendered))
        }
    }
}

fn refused(e: RequestError, n_ctx: usize) -> ApiError {
    match e {
        RequestError::QueueFull { waiting } => {
            ApiError::new(429, format!("the server is busy: {waiting} requests are waiting; retry shortly"))
        }
        RequestError::Stopped => ApiError::new(503, "the server is shutting down"),
        RequestError::PromptTooLong { prompt, .. } => ApiError {
            status: 400,
            message: format!(
                "this model's context holds {n_ctx} tokens, but the prompt is {prompt} tokens: shorten it"
            ),
            param: Some("messages".into()),
            code: Some("context_length_exceeded"),
        },
        RequestError::PromptExceedsPool { prompt, capacity } => ApiError {
            status: 400,
            message: format!("the prompt is {prompt} tokens, but the server's KV cache holds {capacity}"),
            param: None,
            code: Some("context_length_exceeded"),
        },
        RequestError::EmptyPrompt => ApiError::bad("prompt", "the prompt is empty"),
        RequestError::InvalidToken { .. } => ApiError::bad("prompt", e.to_string()),
        RequestError::NoTokens => ApiError::bad("max_tokens", e.to_string()),
        RequestError::Sampling(SamplingError::BiasTokenOutOfRange { .. }) => ApiError::bad("logit_bias", e.to_string()),
        RequestError::Sampling(_) | RequestError::Stop(_) => ApiError::new(400, e.to_string()),
        RequestError::TooManyTopLogprobs(_) => ApiError::bad("top_logprobs", e.to_string()),
        RequestError::BadChoiceCount { .. } => ApiError::bad("n", e.to_string()),
    }
}

async fn generate(state: Arc<AppState>, req: HttpRequest, chat: bool) -> Response {
    let (mut log, headers, body) = start(&state, req);
    let body = match read_body(&headers, body, state.config.max_body_bytes).await {
        Ok(b) => b,
        Err(e) => return fail(log, e),
    };
    // Parsing, tokenizing and rendering templates take CPU time: off the async workers.
    let st = state.clone();
    let prepared = tokio::task::spawn_blocking(move || -> Result<(GenerationRequest, Vec<u32>), ApiError> {
        let req = openai::parse_in(&body, chat, st.tool_style)?;
        let tokens = encode(&st, &req.prompt, req.tools.as_deref())?;
        Ok((req, tokens))
    })
    .await
    .unwrap_or_else(|e| Err(ApiError::new(500, format!("preparing the request: {e}"))));
    let (req, prompt) = match prepared {
        Ok(p) => p,
        Err(e) => return fail(log, e),
    };
    log.stream = req.stream;
    let n_ctx = state.engine.config().n_ctx;
    let max_tokens = req.max_tokens.unwrap_or(if chat { n_ctx } else { 16 });
    let engine_req = Request {
        prompt,
        max_tokens,
        sampling: req.sampling,
        stop: req.stop.clone(),
        ignore_eos: req.ignore_eos,
        // `best_of` ranks the choices by their tokens' log-probabilities.
        logprobs: req.logprobs.is_some() || req.best_of > req.n,
        top_logprobs: req.logprobs.unwrap_or(0),
        format: req.format,
        logit_bias: req.logit_bias.clone(),
        dry_breakers: req.dry_breakers.clone(),
    };
    let streams = match state.engine.submit_n(engine_req, req.best_of) {
        Ok(s) => s,
        Err(e) => return fail(log, refused(e, n_ctx)),
    };
    let id = format!("{}-{}", if chat { "chatcmpl" } else { "cmpl" }, streams[0].id());
    log.id = Some(id.clone());
    log.choices = streams.len();
    let created = unix_now();
    if req.stream {
        let choices = (0..streams.len()).map(|_| ChoiceState::default()).collect();
        let events = StreamState {
            streams,
            choices,
            next_poll: 0,
            usage: None,
            log,
            state: state.clone(),
            id,
            created,
            chat,
            include_usage: req.include_usage,
            done: false,
            tail: Vec::new(),
            logprobs: req.logprobs.is_some(),
            tools: req.tools.clone(),
        };
        let sse = futures_util::stream::unfold(events, |mut st| async move {
            let ev = st.next_event().await?;
            Some((Ok::<_, std::convert::Infallible>(ev), st))
        });
        return Sse::new(sse).keep_alive(KeepAlive::default()).into_response();
    }
    // Each choice's events wait in its own channel, so reading the choices one after the other loses nothing.
    let mut outs = Vec::with_capacity(streams.len());
    // Each choice's mean log-probability per token, for `best_of`.
    let mut scores = Vec::with_capacity(streams.len());
    let mut usage: Option<Usage> = None;
    for mut stream in streams {
        let mut text = String::new();
        let mut entries = Vec::new();
        let (mut sum, mut count) = (0f64, 0usize);
        loop {
            match stream.next().await {
                Some(Event::Token { id, text: t, logprob, top_logprobs }) => {
                    log.ttft.get_or_insert_with(|| log.start.elapsed());
                    text.push_str(&t);
                    sum += f64::from(logprob.unwrap_or(0.0));
                    count += 1;
                    if req.logprobs.is_some() {
                        entries.push(token_logprobs(&state.tokenizer, id, logprob, &top_logprobs));
                    }
                }
                Some(Event::Done(done)) => {
                    text.push_str(&done.text);
                    let finish = openai::finish_reason(done.finish);
                    usage = Some(add_choice(usage, &done.usage));
                    let logprobs = req.logprobs.is_some().then(|| openai::logprobs_json(chat, &entries, 0));
                    let (text, finish, tool_calls) = read_tool_reply(req.tools.as_deref(), text, finish);
                    log.finish = Some(finish);
                    outs.push(openai::ChoiceOut { text, finish, logprobs, tool_calls });
                    // A choice that ended before any token has nothing to rank it by: it comes last.
                    scores.push(if count == 0 { f64::NEG_INFINITY } else { sum / count as f64 });
                    break;
                }
                Some(Event::Failed(e)) => return fail(log, ApiError::new(500, format!("generation failed: {e}"))),
                None => return fail(log, ApiError::new(503, "the engine stopped before the request ended")),
            }
        }
    }
    if req.best_of > req.n {
        // The `n` with the highest mean log-probability per token, best first (OpenAI's rule); the usage still
        // counts every generated token.
        let mut order: Vec<usize> = (0..outs.len()).collect();
        order.sort_by(|&a, &b| scores[b].total_cmp(&scores[a]));
        let mut slots: Vec<Option<openai::ChoiceOut>> = outs.into_iter().map(Some).collect();
        outs = order.into_iter().take(req.n).filter_map(|i| slots[i].take()).collect();
    }
    let usage = usage.unwrap_or_default();
    log.usage = Some(usage);
    let meta = ResponseMeta { id: &id, created, model: &state.config.model_name, chat };
    axum::Json(meta.full(&outs, &usage)).into_response()
}

/// A reply under `tools` read back: its calls (the finish reason becomes `tool_calls`; in Hermes' style with the
/// words written before them) or its answer in words. Of a reply cut short (by `max_tokens`), words are given as far
/// as they go, a call as it was written.
fn read_tool_reply(
    tools: Option<&ToolUse>,
    text: String,
    finish: &'static str,
) -> (String, &'static str, Option<Vec<ToolCall>>) {
    let Some(tools) = tools else {
        return (text, finish, None);
    };
    let mut reader = tools.reader();
    let (words, calls) = crate::tools::words_and_calls(reader.push_end(&text));
    if reader.is_complete() {
        (words, "tool_calls", Some(calls))
    } else if reader.is_response() {
        (words, finish, None)
    } else {
        (text, finish, None)
    }
}

/// A reply's pieces as a streamed delta has them: the words (`content`), and the calls' parts (`tool_calls`
/// entries, one per call: its id and name when it begins, then pieces of its arguments).
fn stream_pieces(pieces: Vec<ReplyPiece>) -> (Option<String>, Vec<Value>) {
    let mut words: Option<String> = None;
    let mut calls: Vec<Value> = Vec::new();
    for p in pieces {
        match p {
            ReplyPiece::Words(w) => words.get_or_insert_with(String::new).push_str(&w),
            ReplyPiece::CallStart { index, id, name } => calls.push(json!({
                "index": index, "id": id, "type": "function", "function": {"name": name, "arguments": ""},
            })),
            ReplyPiece::Arguments { index, text } => match calls.last_mut() {
                Some(last) if last["index"] == json!(index) => {
                    let mut joined = last["function"]["arguments"].as_str().unwrap_or_default().to_string();
                    joined.push_str(&text);
                    last["function"]["arguments"] = json!(joined);
                }
                _ => calls.push(json!({"index": index, "function": {"arguments": text}})),
            },
        }
    }
    (words, calls)
}

/// The usage of a request of several choices so far, with one more choice's: the prompt counts once (the choices
/// share it), the completions add up.
fn add_choice(sum: Option<Usage>, one: &Usage) -> Usage {
    match sum {
        None => *one,
        Some(u) => Usage { completion_tokens: u.completion_tokens + one.completion_tokens, ..u },
    }
}

/// Where one choice of a streamed response is.
#[derive(Default)]
struct ChoiceState {
    /// No chunk sent yet (the first chat chunk announces the role).
    sent: bool,
    done: bool,
    /// Tokens whose logprobs wait for the next chunk with text (their text is held back).
    pending: Vec<TokenLogprobs>,
    /// Bytes of the tokens whose logprobs were sent (the completions endpoint's `text_offset`).
    offset: usize,
    /// A tool reply so far: its words, and its calls' names and arguments, are sent as they come.
    reader: Option<CallReader>,
}

/// A streamed response in progress. Dropped early (the client went away), it logs the request as cut off; the
/// engine sees the dropped [`RequestStream`]s and cancels the request's choices.
struct StreamState {
    /// One per choice, in choice order.
    streams: Vec<RequestStream>,
    choices: Vec<ChoiceState>,
    /// The choice polled first next time, in turn, so that no choice's chunks wait behind another's.
    next_poll: usize,
    /// Of the choices finished so far.
    usage: Option<Usage>,
    log: LogLine,
    state: Arc<AppState>,
    id: String,
    created: u64,
    chat: bool,
    include_usage: bool,
    done: bool,
    /// Events still to send after the end, last first.
    tail: Vec<SseEvent>,
    /// The request asked for logprobs.
    logprobs: bool,
    /// The request's tools, when calls are possible.
    tools: Option<Arc<ToolUse>>,
}

/// One token's logprobs with the tokens' bytes, for a response.
fn token_logprobs(tok: &Tokenizer, id: u32, logprob: Option<f32>, top: &[(u32, f32)]) -> TokenLogprobs {
    TokenLogprobs {
        bytes: tok.token_bytes(id, true).to_vec(),
        logprob: logprob.unwrap_or(f32::NAN),
        top: top.iter().map(|&(t, x)| (tok.token_bytes(t, true).to_vec(), x)).collect(),
    }
}

impl StreamState {
    fn data(v: &Value) -> SseEvent {
        SseEvent::default().data(v.to_string())
    }

    /// The logprobs of the tokens waiting for a chunk of choice `c` (`None` if the request did not ask for them).
    fn take_logprobs(wanted: bool, chat: bool, c: &mut ChoiceState) -> Option<Value> {
        if !wanted {
            return None;
        }
        let v = openai::logprobs_json(chat, &c.pending, c.offset);
        c.offset += c.pending.iter().map(|e| e.bytes.len()).sum::<usize>();
        c.pending.clear();
        Some(v)
    }

    /// The next event of any choice still going, taking the choices in turn; `None` once all streams ended.
    async fn next_choice_event(&mut self) -> Option<(usize, Event)> {
        std::future::poll_fn(|cx| {
            let n = self.streams.len();
            let mut open = false;
            for k in 0..n {
                let i = (self.next_poll + k) % n;
                if self.choices[i].done {
                    continue;
                }
                match self.streams[i].poll_next(cx) {
                    std::task::Poll::Ready(Some(ev)) => {
                        self.next_poll = (i + 1) % n;
                        return std::task::Poll::Ready(Some((i, ev)));
                    }
                    std::task::Poll::Ready(None) => {}
                    std::task::Poll::Pending => open = true,
                }
            }
            if open { std::task::Poll::Pending } else { std::task::Poll::Ready(None) }
        })
        .await
    }

    /// The next SSE event: a chunk of text, a choice's last chunk, the usage, `[DONE]`, or the end.
    async fn next_event(&mut self) -> Option<SseEvent> {
        if self.done {
            return self.tail.pop();
        }
        loop {
            let Some((i, event)) = self.next_choice_event().await else {
                // A stream ended without its last event: the engine stopped.
                self.done = true;
                return None;
            };
            let meta = ResponseMeta {
                id: &self.id,
                created: self.created,
                model: &self.state.config.model_name,
                chat: self.chat,
            };
            let c = &mut self.choices[i];
            match event {
                Event::Token { id, text, logprob, top_logprobs } => {
                    self.log.ttft.get_or_insert_with(|| self.log.start.elapsed());
                    if self.logprobs {
                        c.pending.push(token_logprobs(&self.state.tokenizer, id, logprob, &top_logprobs));
                    }
                    let (text, calls) = match (&self.tools, &mut c.reader) {
                        (Some(t), reader) => stream_pieces(reader.get_or_insert_with(|| t.reader()).push(&text)),
                        (None, _) => (Some(text), Vec::new()),
                    };
                    let text = text.filter(|t| !t.is_empty());
                    if text.is_none() && calls.is_empty() {
                        continue;
                    }
                    let logprobs = Self::take_logprobs(self.logprobs, self.chat, c);
                    let first = !std::mem::replace(&mut c.sent, true);
                    let mut chunk = meta.chunk(i, text.as_deref(), first, None, None, logprobs);
                    if !calls.is_empty() {
                        chunk["choices"][0]["delta"]["tool_calls"] = Value::Array(calls);
                    }
                    return Some(Self::data(&chunk));
                }
                Event::Done(done) => {
                    let finish = openai::finish_reason(done.finish);
                    c.done = true;
                    let usage = add_choice(self.usage, &done.usage);
                    self.usage = Some(usage);
                    // A tool reply's last pieces, and whether it made calls; one its reader could not follow goes out
                    // whole as text.
                    let (text, finish, calls) = match &self.tools {
                        Some(t) => {
                            let mut reader = c.reader.take().unwrap_or_else(|| t.reader());
                            let (words, calls) = stream_pieces(reader.push_end(&done.text));
                            if reader.is_other() {
                                (reader.raw().to_string(), finish, Vec::new())
                            } else if reader.is_complete() {
                                (words.unwrap_or_default(), "tool_calls", calls)
                            } else {
                                (words.unwrap_or_default(), finish, calls)
                            }
                        }
                        None => (done.text, finish, Vec::new()),
                    };
                    self.log.finish = Some(finish);
                    let text = (!text.is_empty()).then_some(text.as_str());
                    let logprobs = Self::take_logprobs(self.logprobs, self.chat, c);
                    let first = !std::mem::replace(&mut c.sent, true);
                    let with_calls = |mut chunk: Value| {
                        if !calls.is_empty() {
                            chunk["choices"][0]["delta"]["tool_calls"] = Value::Array(calls.clone());
                        }
                        chunk
                    };
                    if !self.choices.iter().all(|c| c.done) {
                        let chunk = with_calls(meta.chunk(i, text, first, Some(finish), None, logprobs));
                        return Some(Self::data(&chunk));
                    }
                    // The last choice to finish: its chunk carries the usage of all (unless a usage chunk follows).
                    self.log.usage = Some(usage);
                    self.done = true;
                    let in_chunk = (!self.include_usage).then_some(&usage);
                    let last = Self::data(&with_calls(meta.chunk(i, text, first, Some(finish), in_chunk, logprobs)));
                    if self.include_usage {
                        self.tail.push(Self::data(&meta.usage_chunk(&usage)));
                    }
                    self.tail.push(SseEvent::default().data("[DONE]"));
                    self.tail.reverse();
                    return Some(last);
                }
                Event::Failed(e) => {
                    // One failed choice fails the response; dropping the streams then cancels the others.
                    self.log.error = Some(e.clone());
                    self.done = true;
                    self.streams.clear();
                    let err = ApiError::new(500, format!("generation failed: {e}"));
                    self.tail.push(SseEvent::default().data("[DONE]"));
                    return Some(Self::data(&err.body()));
                }
            }
        }
    }
}

async fn models(State(state): State<Arc<AppState>>, req: HttpRequest) -> Response {
    drop(start(&state, req).0);
    axum::Json(json!({
        "object": "list",
        "data": [{
            "id": state.config.model_name,
            "object": "model",
            "created": state.started,
            "owned_by": "infer",
            "max_model_len": state.engine.config().n_ctx,
        }],
    }))
    .into_response()
}

async fn health(State(state): State<Arc<AppState>>) -> Response {
    // Not logged: load balancers poll it.
    if state.shutting_down.load(Ordering::Relaxed) {
        (StatusCode::SERVICE_UNAVAILABLE, axum::Json(json!({ "status": "shutting down" }))).into_response()
    } else {
        axum::Json(json!({ "status": "ok" })).into_response()
    }
}

async fn metrics_handler(State(state): State<Arc<AppState>>) -> Response {
    // Not logged: Prometheus scrapes it every few seconds.
    let text = metrics::render(&state.engine.stats(), state.engine.pool_plan(), &state.http);
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")], text).into_response()
}

async fn tokenize(State(state): State<Arc<AppState>>, req: HttpRequest) -> Response {
    let (log, headers, body) = start(&state, req);
    let body = match read_body(&headers, body, state.config.max_body_bytes).await {
        Ok(b) => b,
        Err(e) => return fail(log, e),
    };
    let st = state.clone();
    let result = tokio::task::spawn_blocking(move || -> Result<Vec<u32>, ApiError> {
        let v: Value = serde_json::from_slice(&body)
            .map_err(|e| ApiError::new(400, format!("the request body is not valid JSON: {e}")))?;
        match (v.get("content").or_else(|| v.get("prompt")), v.get("messages")) {
            (Some(Value::String(s)), _) => encode(&st, &Prompt::Text(s.clone()), None),
            (_, Some(_)) => {
                // As a chat request renders it, tools included, so that the prefix hashes are its blocks'.
                let req = openai::parse_in(&serde_json::to_vec(&v).unwrap_or_default(), true, st.tool_style)?;
                encode(&st, &req.prompt, req.tools.as_deref())
            }
            _ => Err(ApiError::bad("content", "give `content` (a string) or `messages` (a conversation)")),
        }
    })
    .await
    .unwrap_or_else(|e| Err(ApiError::new(500, format!("tokenizing: {e}"))));
    match result {
        Ok(tokens) => {
            drop(log);
            let hashes: Vec<String> =
                prefix_hashes(&tokens, DEFAULT_BLOCK_SIZE).iter().map(|h| format!("{h:016x}")).collect();
            axum::Json(json!({ "tokens": tokens, "block_size": DEFAULT_BLOCK_SIZE, "prefix_hashes": hashes }))
                .into_response()
        }
        Err(e) => fail(log, e),
    }
}

async fn not_found(State(state): State<Arc<AppState>>, req: HttpRequest) -> Response {
    let log = start(&state, req).0;
    let e = ApiError::new(404, format!("no route for {} {}", log.method, log.path));
    fail(log, e)
}

async fn method_not_allowed(State(state): State<Arc<AppState>>, req: HttpRequest) -> Response {
    let log = start(&state, req).0;
    let e = ApiError::new(405, format!("{} is not allowed on {}", log.method, log.path));
    fail(log, e)
}
