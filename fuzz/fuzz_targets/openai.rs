//! `infer serve`'s HTTP API on arbitrary request bodies: the bytes go, as the body of a POST to
//! `/v1/completions`, `/v1/chat/completions` or `/tokenize`, through the server's own router (body limit, JSON
//! parsing and validation, the chat template, the tokenizer, the engine's admission checks, generation and the
//! response, streamed or whole) on a tiny model with a real engine behind it.
//!
//! The first byte picks the route, the `Content-Length` header (none, the true one, or one over the limit) and the
//! chat template (chatml, or one with Hermes' or Llama 3's call format); the rest is the body. What may not happen: a panic (in a handler, the engine thread or a blocking task), a 5xx,
//! an error that is not an OpenAI error body, a 200 that is not a whole response or a stream ending in `[DONE]`.
#![no_main]

use std::sync::{Arc, OnceLock};

use axum::body::Body;
use axum::http::{Request, header};
use infer::engine::{Engine, EngineConfig, KvBudget};
use infer::gguf::GgufFile;
use infer::model::{KvDtype, Model};
use infer::server::{AppState, LogFormat, ServerConfig, router};
use infer::tokenizer::Tokenizer;
use infer::tokenizer::chat::ChatTemplate;
use infer_fuzz::FuzzModel;
use libfuzzer_sys::fuzz_target;
use serde_json::Value;
use tower::ServiceExt;

const ROUTES: [&str; 3] = ["/v1/completions", "/v1/chat/completions", "/tokenize"];
/// Small, so that the fuzzer reaches the 413 both by the declared length and by the bytes read.
const MAX_BODY: usize = 4096;

struct App {
    runtime: tokio::runtime::Runtime,
    /// With the built-in chatml template (tools in the JSON protocol), and with templates that have their own call
    /// format (`tests/data/tagged-tools.jinja`, Hermes' tags; `tests/data/llama3-tools.jinja`, Llama 3's bare
    /// calls): the tools, calls and results go to the template, replies in its format.
    routers: [axum::Router; 3],
}

fn app() -> &'static App {
    static APP: OnceLock<App> = OnceLock::new();
    APP.get_or_init(|| {
        let bytes = FuzzModel::default().to_gguf().expect("the plain fuzz model is valid");
        let file = GgufFile::from_bytes(bytes).expect("the plain fuzz model parses");
        let model = Model::from_file(Arc::new(file)).expect("the plain fuzz model loads");
        let tokenizer = Arc::new(Tokenizer::from_gguf(model.file()).expect("its tokenizer loads"));
        let template = ChatTemplate::from_gguf(model.file(), Some("chatml")).expect("the built-in chatml template");
        // A context of 48 tokens bounds every generation (chat requests default to the whole context).
        let config = EngineConfig {
            n_ctx: 48,
            max_seqs: 2,
            max_batch_tokens: 64,
            max_queue: 4,
            kv: KvBudget::Blocks(16),
            kv_dtype: KvDtype::F16,
            prefix_cache: true,
            threads: 1,
        };
        let engine = Arc::new(Engine::start(Arc::new(model), tokenizer.clone(), config).expect("the engine starts"));
        let config = ServerConfig { model_name: "fuzz".into(), max_body_bytes: MAX_BODY, log_format: LogFormat::Json };
        let tagged = ChatTemplate::new("tagged", include_str!("../../tests/data/tagged-tools.jinja"), "", "")
            .expect("the tagged test template");
        let llama3 = ChatTemplate::new("llama3", include_str!("../../tests/data/llama3-tools.jinja"), "", "")
            .expect("the Llama 3 test template");
        let state = AppState::new(engine.clone(), tokenizer.clone(), Some(template), config.clone());
        let tagged = AppState::new(engine.clone(), tokenizer.clone(), Some(tagged), config.clone());
        let llama3 = AppState::new(engine, tokenizer, Some(llama3), config);
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("a tokio runtime");
        App { runtime, routers: [router(state), router(tagged), router(llama3)] }
    })
}

fn assert_error_body(status: u16, body: &[u8]) {
    let v: Value = serde_json::from_slice(body).unwrap_or_else(|e| panic!("{status}: the error body is not JSON: {e}"));
    let message = v["error"]["message"].as_str().unwrap_or_default();
    assert!(!message.is_empty(), "{status}: no error message: {v}");
    assert!(v["error"]["type"].as_str().is_some_and(|t| t.ends_with("_error")), "{status}: {v}");
}

fuzz_target!(
    init: {
        app();
    },
    |data: &[u8]| {
    let Some((&sel, body)) = data.split_first() else { return };
    let route = ROUTES[usize::from(sel & 3) % ROUTES.len()];
    let mut req = Request::builder().method("POST").uri(route).header(header::CONTENT_TYPE, "application/json");
    match (sel >> 2) & 3 {
        1 => req = req.header(header::CONTENT_LENGTH, body.len()),
        2 => req = req.header(header::CONTENT_LENGTH, MAX_BODY + 1 + body.len()),
        _ => {}
    }
    let Ok(req) = req.body(Body::from(body.to_vec())) else { return };
    let app = app();
    let (status, content_type, bytes) = app.runtime.block_on(async {
        let routed = &app.routers[usize::from(sel >> 4) % 3];
        let resp = routed.clone().oneshot(req).await.expect("the router is infallible");
        let status = resp.status().as_u16();
        let ct = resp.headers().get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).unwrap_or("").to_string();
        let bytes = axum::body::to_bytes(resp.into_body(), usize::MAX).await.expect("the response body is read");
        (status, ct, bytes)
    });
    assert!(matches!(status, 200 | 400 | 413), "status {status}: {}", String::from_utf8_lossy(&bytes));
    if status != 200 {
        assert_error_body(status, &bytes);
        return;
    }
    if content_type.starts_with("text/event-stream") {
        let text = std::str::from_utf8(&bytes).expect("the stream is UTF-8");
        let events: Vec<&str> = text.lines().filter_map(|l| l.strip_prefix("data: ")).collect();
        assert_eq!(events.last(), Some(&"[DONE]"), "the stream does not end with [DONE]: {text}");
        for e in &events[..events.len() - 1] {
            let v: Value = serde_json::from_str(e).unwrap_or_else(|err| panic!("a chunk is not JSON ({err}): {e}"));
            assert!(v.get("error").is_none(), "a stream failed: {v}");
        }
    } else {
        let v: Value = serde_json::from_slice(&bytes).expect("a 200 body is JSON");
        let whole = v["choices"][0]["finish_reason"].is_string();
        assert!(whole || v["tokens"].is_array(), "a 200 that is neither a response nor tokens: {v}");
    }
});
