//! `infer serve`: the HTTP API on a tiny synthetic model (errors, limits, streaming, metrics, shutdown) and on
//! SmolLM2 (sixteen concurrent chat requests sharing a system prompt), and the official `openai` Python client.

use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use infer::kernels::GgmlType;
use serde_json::{Value, json};

use crate::common::{infer_bin, real_model, tempdir};
use crate::synthetic::{Spec, build};

/// A running `infer serve` on a free port, killed when dropped.
pub struct Server {
    child: Child,
    pub base: String,
    log: Arc<Mutex<Vec<String>>>,
    /// The thread copying stderr into `log`; it ends at the pipe's end (the server gone), with every line in.
    reader: Option<std::thread::JoinHandle<()>>,
}

impl Server {
    pub fn start(model: &Path, extra: &[&str]) -> Server {
        let mut child = infer_bin()
            .args(["serve", model.to_str().unwrap(), "--port", "0", "-t", "2"])
            .args(extra)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn infer serve");
        let stderr = child.stderr.take().unwrap();
        let log = Arc::new(Mutex::new(Vec::new()));
        let (tx, rx) = std::sync::mpsc::channel();
        let reader = {
            let log = log.clone();
            std::thread::spawn(move || {
                for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                    if let Some(rest) = line.strip_prefix("listening on http://") {
                        let _ = tx.send(rest.split_whitespace().next().unwrap_or_default().to_string());
                    }
                    log.lock().unwrap().push(line);
                }
            })
        };
        let addr = match rx.recv_timeout(Duration::from_secs(120)) {
            Ok(a) => a,
            Err(_) => {
                let _ = child.kill();
                panic!("the server did not start: {:?}", log.lock().unwrap());
            }
        };
        Server { child, base: format!("http://{addr}"), log, reader: Some(reader) }
    }

    pub fn log(&self) -> Vec<String> {
        self.log.lock().unwrap().clone()
    }

    /// The log once `done` holds for it, waiting up to `limit` (failing the test past it): the server writes a
    /// request's line after the response has gone out, so a client that has its reply may still be ahead of the
    /// line (CI saw exactly that race).
    pub fn log_when(&self, what: &str, limit: Duration, done: impl Fn(&[String]) -> bool) -> Vec<String> {
        let start = Instant::now();
        loop {
            let log = self.log();
            if done(&log) {
                return log;
            }
            assert!(start.elapsed() < limit, "no log line {what}: {log:#?}");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Sends a signal (`TERM`, `INT`) to the server.
    #[cfg(unix)]
    pub fn signal(&self, name: &str) {
        let pid = self.child.id().to_string();
        let status = std::process::Command::new("kill").args([&format!("-{name}"), &pid]).status().unwrap();
        assert!(status.success());
    }

    /// Waits up to `limit` for the server to exit (failing the test past it): its exit status and its whole log
    /// (the reader thread has reached the end of the pipe, so no line is still on its way).
    pub fn wait_exit(mut self, limit: Duration) -> (Option<i32>, Vec<String>) {
        let deadline = Instant::now() + limit;
        let status = loop {
            if let Some(s) = self.child.try_wait().unwrap() {
                break s;
            }
            assert!(Instant::now() < deadline, "the server did not exit within {limit:?}: {:#?}", self.log());
            std::thread::sleep(Duration::from_millis(20));
        };
        let reader = self.reader.take().expect("the log reader is joined once");
        while !reader.is_finished() {
            assert!(Instant::now() < deadline, "the server's stderr stayed open after it exited: {:#?}", self.log());
            std::thread::sleep(Duration::from_millis(5));
        }
        reader.join().expect("the log reader panicked");
        (status.code(), self.log())
    }

    /// Sends SIGTERM and waits for the exit status.
    #[cfg(unix)]
    fn terminate(self) -> (Option<i32>, Vec<String>) {
        self.signal("TERM");
        self.wait_exit(Duration::from_secs(60))
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub fn agent() -> ureq::Agent {
    ureq::Agent::new_with_config(
        ureq::Agent::config_builder()
            .http_status_as_error(false)
            .timeout_global(Some(Duration::from_secs(300)))
            .build(),
    )
}

/// POSTs `body` and returns the status, the headers we look at, and the body.
pub fn post(url: &str, body: &[u8]) -> (u16, Option<String>, String) {
    let mut r = agent().post(url).header("content-type", "application/json").send(body).expect("connect");
    let retry = r.headers().get("retry-after").and_then(|v| v.to_str().ok()).map(str::to_string);
    (r.status().as_u16(), retry, r.body_mut().read_to_string().unwrap_or_default())
}

pub fn get(url: &str) -> (u16, String) {
    let mut r = agent().get(url).call().expect("connect");
    (r.status().as_u16(), r.body_mut().read_to_string().unwrap_or_default())
}

/// The `data:` payloads of a streamed response, read as they arrive.
pub fn stream(url: &str, body: &Value) -> Vec<String> {
    let r = agent().post(url).header("content-type", "application/json").send(body.to_string().as_bytes()).unwrap();
    assert_eq!(r.status().as_u16(), 200);
    let ct = r.headers().get("content-type").unwrap().to_str().unwrap().to_string();
    assert!(ct.starts_with("text/event-stream"), "{ct}");
    let reader = BufReader::new(r.into_body().into_reader());
    reader.lines().map_while(Result::ok).filter_map(|l| l.strip_prefix("data: ").map(str::to_string)).collect()
}

/// One sample of a Prometheus metric (no labels).
pub fn metric(text: &str, name: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(name).and_then(|r| r.strip_prefix(' ')))
        .unwrap_or_else(|| panic!("no {name} in /metrics:\n{text}"))
        .trim()
        .parse()
        .unwrap()
}

pub fn tiny_model(dir: &Path) -> PathBuf {
    let path = dir.join("tiny-llama.gguf");
    build(Spec::llama(GgmlType::Q8_0), 7).write_file(&path).unwrap();
    path
}

/// Posts `base` with `extra`'s fields added to /v1/completions: (status, body).
pub fn completer(server: &Server, base: Value) -> impl Fn(Value) -> (u16, String) {
    let url = format!("{}/v1/completions", server.base);
    move |extra: Value| {
        let mut body = base.clone();
        body.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
        let (status, _, text) = post(&url, body.to_string().as_bytes());
        (status, text)
    }
}

/// The text of a 200 completion.
pub fn text_of((status, text): (u16, String)) -> String {
    assert_eq!(status, 200, "{text}");
    serde_json::from_str::<Value>(&text).unwrap()["choices"][0]["text"].as_str().unwrap().to_string()
}

fn error_of(body: &str) -> Value {
    let v: Value = serde_json::from_str(body).unwrap_or_else(|_| panic!("not JSON: {body}"));
    assert_eq!(v["error"]["type"].as_str().map(|t| t.ends_with("error")), Some(true), "{v}");
    v["error"].clone()
}

#[test]
fn bad_requests_get_4xx_with_openai_error_bodies_and_the_server_stays_up() {
    let dir = tempdir();
    let server =
        Server::start(&tiny_model(dir.path()), &["--ctx-size", "64", "--max-body", "2K", "--chat-template", "chatml"]);
    let url = format!("{}/v1/completions", server.base);
    let chat = format!("{}/v1/chat/completions", server.base);
    for (body, status, needle) in [
        (r#"{"prompt": "hi""#, 400, "not valid JSON"),
        (r#"["prompt"]"#, 400, "must be a JSON object"),
        (r#"{"prompt": "hi", "max_tokens": "ten"}"#, 400, "`max_tokens` must be an integer, not a string"),
        (r#"{"prompt": "hi", "temperature": "hot"}"#, 400, "`temperature` must be a number"),
        (r#"{"prompt": "hi", "top_p": 1.5}"#, 400, "`top_p` must be in (0, 1]"),
        (r#"{"prompt": "hi", "stream": "yes"}"#, 400, "`stream` must be true or false"),
        (r#"{"prompt": "hi", "n": 17}"#, 400, "n = 17 choices: at least 1 and at most 16"),
        (r#"{"prompt": "hi", "max_tokens": 0}"#, 400, "at least 1"),
        (r#"{"prompt": [99999]}"#, 400, "out of range"),
        (r#"{"max_tokens": 5}"#, 400, "`prompt` is required"),
    ] {
        let (got, _, text) = post(&url, body.as_bytes());
        assert_eq!(got, status, "{body} -> {text}");
        let e = error_of(&text);
        assert!(e["message"].as_str().unwrap().contains(needle), "{body}: {e}");
    }
    let (status, _, text) = post(&chat, br#"{"messages": [{"role": "user", "content": 7}]}"#);
    assert_eq!(status, 400);
    assert_eq!(error_of(&text)["param"], "messages[0].content");
    // A prompt longer than the context, by name.
    let long = json!({ "prompt": "a".repeat(100) }).to_string();
    let (status, _, text) = post(&url, long.as_bytes());
    assert_eq!(status, 400);
    let e = error_of(&text);
    assert_eq!(e["code"], "context_length_exceeded");
    assert!(e["message"].as_str().unwrap().contains("context holds 64 tokens, but the prompt is 100"), "{e}");
    // A body over the limit.
    let big = json!({ "prompt": "b".repeat(3000) }).to_string();
    let (status, _, text) = post(&url, big.as_bytes());
    assert_eq!(status, 413);
    assert!(error_of(&text)["message"].as_str().unwrap().contains("2048-byte limit"));
    // Unknown routes and methods.
    let (status, text) = get(&format!("{}/v2/nothing", server.base));
    assert_eq!(status, 404);
    error_of(&text);
    let (status, text) = get(&url);
    assert_eq!(status, 405);
    error_of(&text);
    // Still serving.
    let (status, _, text) = post(&url, br#"{"prompt": "hello", "max_tokens": 3, "temperature": 0}"#);
    assert_eq!(status, 200, "{text}");
    let v: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(v["usage"]["completion_tokens"], 3);
    assert_eq!(v["choices"][0]["finish_reason"], "length");
    let (_, metrics) = get(&format!("{}/metrics", server.base));
    assert!(metrics.contains("infer_http_responses_total{status=\"400\"} 12"), "{metrics}");
    assert!(metrics.contains("infer_http_responses_total{status=\"413\"} 1"), "{metrics}");
    // One log line per request, with the status.
    let log = server.log_when("for every request", Duration::from_secs(30), |log| {
        log.iter().any(|l| l.contains(" POST /v1/completions 200 ") && l.contains("completion=3"))
            && log.iter().filter(|l| l.contains(" POST /v1/completions 4")).count() >= 12
    });
    assert_eq!(log.iter().filter(|l| l.contains(" POST /v1/completions 400 ")).count(), 11, "{log:#?}");
    assert_eq!(log.iter().filter(|l| l.contains(" POST /v1/completions 413 ")).count(), 1);
    assert!(log.iter().any(|l| l.contains(" POST /v1/completions 200 ") && l.contains("completion=3")));
}

#[test]
fn logit_bias_reaches_the_sampler_in_both_forms() {
    let dir = tempdir();
    let server = Server::start(&tiny_model(dir.path()), &["--ctx-size", "64"]);
    let complete = completer(&server, json!({"prompt": "hello", "max_tokens": 4, "temperature": 0}));
    // +100 makes a token the argmax at every step: the reply is that token's text four times, in either form.
    let a = text_of(complete(json!({"logit_bias": {"40": 100}})));
    let b = text_of(complete(json!({"logit_bias": [[41, 100]]})));
    assert_ne!(a, b);
    for t in [&a, &b] {
        let piece = &t[..t.len() / 4];
        assert_eq!(*t, piece.repeat(4), "{t:?}");
    }
    // Banning that token (false, llama-server's form) leaves it out of the reply entirely.
    let banned = text_of(complete(json!({"logit_bias": [[40, 100], [40, false]]})));
    assert!(!banned.contains(&a[..a.len() / 4]) || a.trim().is_empty(), "{banned:?}");
    // A token the vocabulary does not have: 400 naming the field.
    let (status, text) = complete(json!({"logit_bias": {"99999": 1}}));
    assert_eq!(status, 400, "{text}");
    let e = error_of(&text);
    assert_eq!(e["param"], "logit_bias");
    assert!(e["message"].as_str().unwrap().contains("token 99999"), "{e}");
}

#[test]
fn streams_end_with_done_and_carry_usage() {
    let dir = tempdir();
    let server = Server::start(&tiny_model(dir.path()), &["--chat-template", "chatml", "--log-format", "json"]);
    let whole = post(
        &format!("{}/v1/completions", server.base),
        br#"{"prompt": "abc", "max_tokens": 12, "temperature": 0, "ignore_eos": true}"#,
    );
    let whole: Value = serde_json::from_str(&whole.2).unwrap();
    let events = stream(
        &format!("{}/v1/completions", server.base),
        &json!({"prompt": "abc", "max_tokens": 12, "temperature": 0, "ignore_eos": true, "stream": true}),
    );
    assert_eq!(events.last().map(String::as_str), Some("[DONE]"));
    let chunks: Vec<Value> = events[..events.len() - 1].iter().map(|e| serde_json::from_str(e).unwrap()).collect();
    let text: String = chunks.iter().map(|c| c["choices"][0]["text"].as_str().unwrap()).collect();
    assert_eq!(text, whole["choices"][0]["text"].as_str().unwrap(), "streamed text equals the whole response");
    let last = chunks.last().unwrap();
    assert_eq!(last["choices"][0]["finish_reason"], "length");
    assert_eq!(last["usage"]["completion_tokens"], 12);
    assert!(chunks[..chunks.len() - 1].iter().all(|c| c["choices"][0]["finish_reason"].is_null()));

    // Chat, with the usage in a chunk of its own as stream_options asks.
    let events = stream(
        &format!("{}/v1/chat/completions", server.base),
        &json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 5, "ignore_eos": true,
                "stream": true, "stream_options": {"include_usage": true}}),
    );
    let chunks: Vec<Value> = events[..events.len() - 1].iter().map(|e| serde_json::from_str(e).unwrap()).collect();
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
    assert_eq!(chunks[0]["object"], "chat.completion.chunk");
    let usage = chunks.last().unwrap();
    assert_eq!(usage["choices"].as_array().unwrap().len(), 0);
    assert_eq!(usage["usage"]["completion_tokens"], 5);
    assert_eq!(chunks[chunks.len() - 2]["choices"][0]["finish_reason"], "length");

    let (status, models) = get(&format!("{}/v1/models", server.base));
    assert_eq!(status, 200);
    let models: Value = serde_json::from_str(&models).unwrap();
    assert_eq!(models["data"][0]["id"], "tiny-llama");
    let (status, health) = get(&format!("{}/health", server.base));
    assert_eq!((status, health.as_str()), (200, r#"{"status":"ok"}"#));
    let tok = post(&format!("{}/tokenize", server.base), br#"{"content": "0123456789abcdefXYZ"}"#);
    let tok: Value = serde_json::from_str(&tok.2).unwrap();
    assert_eq!(tok["tokens"].as_array().unwrap().len(), 19);
    assert_eq!(tok["prefix_hashes"].as_array().unwrap().len(), 1);
    // JSON log lines.
    let log = server
        .log_when("for the stream", Duration::from_secs(30), |log| log.iter().any(|l| l.contains("\"stream\":true")));
    let line = log.into_iter().find(|l| l.contains("\"stream\":true")).unwrap();
    let line: Value = serde_json::from_str(&line).unwrap();
    assert_eq!(line["status"], 200);
    assert_eq!(line["completion_tokens"], 12);
    assert!(line["ttft_ms"].as_f64().unwrap() > 0.0);
}

/// `n` choices: one response with choices 0..n, each the text a request of one choice with seed `seed + i` gives
/// (and with `best_of`, the best of them by mean log-probability);
/// streamed, each choice's chunks carry its index and end with its own finish reason, and the usage adds up the
/// completions and counts the shared prompt once.
#[test]
fn n_choices_share_one_prompt_and_each_is_its_seed_s_text() {
    let dir = tempdir();
    let server = Server::start(&tiny_model(dir.path()), &["--chat-template", "chatml"]);
    let url = format!("{}/v1/completions", server.base);
    // Hot, so that the synthetic model's choices differ.
    let base = json!({"prompt": "hello there", "max_tokens": 10, "temperature": 8, "top_k": 0, "top_p": 1,
                      "min_p": 0, "ignore_eos": true, "seed": 40});
    let complete = completer(&server, base.clone());
    let singles: Vec<String> = (0..3).map(|i| text_of(complete(json!({"seed": 40 + i})))).collect();
    assert!(singles.iter().any(|t| *t != singles[0]), "the seeds give different texts: {singles:?}");
    let (status, body) = complete(json!({"n": 3, "logprobs": 1}));
    assert_eq!(status, 200, "{body}");
    let whole: Value = serde_json::from_str(&body).unwrap();
    let choices = whole["choices"].as_array().unwrap();
    assert_eq!(choices.len(), 3);
    for (i, c) in choices.iter().enumerate() {
        assert_eq!(c["index"], i);
        assert_eq!(c["text"].as_str().unwrap(), singles[i], "choice {i}");
        assert_eq!(c["finish_reason"], "length");
        assert_eq!(c["logprobs"]["tokens"].as_array().unwrap().len(), 10, "choice {i}'s logprobs");
    }
    let one: Value = serde_json::from_str(&complete(json!({})).1).unwrap();
    assert_eq!(whole["usage"]["prompt_tokens"], one["usage"]["prompt_tokens"], "the prompt counts once");
    assert_eq!(whole["usage"]["completion_tokens"], 30);

    // best_of 4, n 2: the two of the four seeds' texts with the highest mean log-probability per token, best first.
    let mut ranked: Vec<(f64, String)> = (0..4)
        .map(|i| {
            let (status, body) = complete(json!({"seed": 40 + i, "logprobs": 1}));
            assert_eq!(status, 200, "{body}");
            let v: Value = serde_json::from_str(&body).unwrap();
            let lps: Vec<f64> = v["choices"][0]["logprobs"]["token_logprobs"]
                .as_array()
                .unwrap()
                .iter()
                .map(|x| x.as_f64().unwrap())
                .collect();
            (lps.iter().sum::<f64>() / lps.len() as f64, v["choices"][0]["text"].as_str().unwrap().to_string())
        })
        .collect();
    let first_two = [ranked[0].1.clone(), ranked[1].1.clone()];
    ranked.sort_by(|a, b| b.0.total_cmp(&a.0));
    assert_ne!([ranked[0].1.clone(), ranked[1].1.clone()], first_two, "the ranking must reorder the seeds' texts");
    let (status, body) = complete(json!({"n": 2, "best_of": 4}));
    assert_eq!(status, 200, "{body}");
    let best: Value = serde_json::from_str(&body).unwrap();
    let texts: Vec<&str> = best["choices"].as_array().unwrap().iter().map(|c| c["text"].as_str().unwrap()).collect();
    assert_eq!(texts, [ranked[0].1.as_str(), ranked[1].1.as_str()], "{ranked:?}");
    assert!(best["choices"][0]["logprobs"].is_null(), "logprobs only when asked for");
    assert_eq!(best["usage"]["completion_tokens"], 40, "every generated token counts");

    let mut body = base.clone();
    body.as_object_mut().unwrap().extend(
        json!({"n": 3, "stream": true, "stream_options": {"include_usage": true}}).as_object().unwrap().clone(),
    );
    let events = stream(&url, &body);
    assert_eq!(events.last().map(String::as_str), Some("[DONE]"));
    let chunks: Vec<Value> = events[..events.len() - 1].iter().map(|e| serde_json::from_str(e).unwrap()).collect();
    let usage = chunks.last().unwrap();
    assert_eq!(usage["choices"].as_array().unwrap().len(), 0);
    assert_eq!(usage["usage"]["completion_tokens"], 30);
    let mut texts = vec![String::new(); 3];
    let mut finishes = [0; 3];
    for c in &chunks[..chunks.len() - 1] {
        let choice = &c["choices"][0];
        let i = choice["index"].as_u64().unwrap() as usize;
        texts[i] += choice["text"].as_str().unwrap();
        if !choice["finish_reason"].is_null() {
            finishes[i] += 1;
        }
    }
    assert_eq!(texts, singles, "streamed choices");
    assert_eq!(finishes, [1, 1, 1], "one last chunk per choice");

    // Chat: each choice's first chunk announces the role.
    let events = stream(
        &format!("{}/v1/chat/completions", server.base),
        &json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "ignore_eos": true, "n": 2,
                "stream": true}),
    );
    let chunks: Vec<Value> = events[..events.len() - 1].iter().map(|e| serde_json::from_str(e).unwrap()).collect();
    for i in 0..2 {
        let first = chunks.iter().find(|c| c["choices"][0]["index"] == i).unwrap();
        assert_eq!(first["choices"][0]["delta"]["role"], "assistant", "choice {i}");
    }
    assert_eq!(chunks.last().unwrap()["usage"]["completion_tokens"], 8);
    // A request's line is written after its last chunk went out, so the client may read [DONE] first: wait for
    // the streamed request's own line (waiting for the earlier n = 3 request's line raced it).
    server.log_when("for the streamed n = 3 request", Duration::from_secs(30), |log| {
        log.iter().any(|l| l.contains(" n=3 stream") && l.contains("completion=30"))
    });
}

/// `--trace`: a line per engine step. In JSON, the steps of one request of two choices carry its prompt once and
/// each choice's tokens but the last, show the fork, the shared blocks and the batch, and end with nothing running;
/// in text, the same steps read as the README shows.
#[test]
fn trace_prints_every_step_of_the_engine() {
    let dir = tempdir();
    let model = tiny_model(dir.path());
    let server = Server::start(&model, &["--trace", "--log-format", "json", "--max-batch-tokens", "16"]);
    let body = json!({"prompt": [5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24],
                      "max_tokens": 4, "ignore_eos": true, "n": 2});
    let (status, _, text) = post(&format!("{}/v1/completions", server.base), body.to_string().as_bytes());
    assert_eq!(status, 200, "{text}");
    // The last step's line comes after the step, so it may follow the request's own log line: wait for the step
    // that ends the request (no request running, none waiting).
    let log = server.log_when("for the last step", Duration::from_secs(30), |log| {
        log.iter().filter(|l| l.contains("\"step\":")).any(|l| {
            let v: Value = serde_json::from_str(l).unwrap();
            v["running"] == 0 && v["waiting"] == 0
        })
    });
    let steps: Vec<Value> =
        log.iter().filter(|l| l.contains("\"step\":")).map(|l| serde_json::from_str(l).unwrap()).collect();
    let sum = |k: &str| steps.iter().map(|s| s[k].as_u64().unwrap()).sum::<u64>();
    // 20 prompt tokens in chunks of 16 and 4, then 3 more tokens for each choice.
    assert_eq!(sum("batch_tokens"), 20 + 2 * 3, "{steps:#?}");
    assert_eq!(steps[0]["batch"][0]["tokens"], 16);
    assert_eq!(steps[0]["batch"][0]["decode"], false);
    assert_eq!(sum("forked"), 1);
    assert_eq!(sum("admitted"), 1);
    assert_eq!(sum("admitted_prompt_tokens"), 20);
    assert_eq!(sum("finished"), 2);
    let fork = steps.iter().find(|s| s["forked"] == 1).unwrap();
    assert!(fork["kv_blocks_shared"].as_u64().unwrap() >= 1, "the choices share the prompt's blocks: {fork}");
    assert_eq!(fork["running"], 2);
    let last = steps.last().unwrap();
    assert_eq!((last["running"].as_u64(), last["waiting"].as_u64()), (Some(0), Some(0)));
    drop(server);

    let server = Server::start(&model, &["--trace"]);
    let (status, _, text) = post(&format!("{}/v1/completions", server.base), body.to_string().as_bytes());
    assert_eq!(status, 200, "{text}");
    let log = server.log_when("for the request", Duration::from_secs(30), |log| {
        log.iter().any(|l| l.contains(" POST /v1/completions 200 "))
    });
    let first = log.iter().find(|l| l.contains(" step 1 ")).unwrap_or_else(|| panic!("{log:#?}"));
    for part in ["batch 20 tok, 1 req: 0 decode, prefill #", "+0:20", "+1 admitted (cached 0/20)", "1 forked", "| kv "]
    {
        assert!(first.contains(part), "{part:?} in {first}");
    }
}

#[test]
fn a_full_queue_answers_429_with_retry_after() {
    let dir = tempdir();
    // A context of 100,000 tokens: the long request cannot reach its end (minutes of generation on this model)
    // before the client drops it, however slowly the test gets its other requests in.
    let server = Server::start(&tiny_model(dir.path()), &["--max-seqs", "1", "--max-queue", "1", "-c", "100000"]);
    let url = format!("{}/v1/completions", server.base);
    let metrics = || get(&format!("{}/metrics", server.base)).1;
    // One request generates until it is dropped (its stream open), one waits behind it.
    let long = agent()
        .post(&url)
        .send(json!({"prompt": "x", "max_tokens": 100000, "ignore_eos": true, "stream": true}).to_string().as_bytes())
        .unwrap();
    let mut long = BufReader::new(long.into_body().into_reader());
    let mut first = String::new();
    long.read_line(&mut first).unwrap();
    let waiting = {
        let url = url.clone();
        std::thread::spawn(move || post(&url, br#"{"prompt": "y", "max_tokens": 2}"#))
    };
    let start = Instant::now();
    while metric(&metrics(), "infer_requests_waiting") < 1.0 {
        assert!(start.elapsed() < Duration::from_secs(60), "the second request never queued");
        std::thread::sleep(Duration::from_millis(10));
    }
    let (status, retry, text) = post(&url, br#"{"prompt": "z", "max_tokens": 2}"#);
    assert_eq!((status, retry.as_deref()), (429, Some("1")), "{text}");
    assert!(error_of(&text)["message"].as_str().unwrap().contains("busy"));
    // The client of the long request goes away: it is cancelled, and the waiting one runs.
    drop(long);
    let (status, _, text) = waiting.join().unwrap();
    assert_eq!(status, 200, "{text}");
    let start = Instant::now();
    while metric(&metrics(), "infer_requests_cancelled_total") < 1.0 {
        assert!(start.elapsed() < Duration::from_secs(60), "the dropped stream was not cancelled");
        std::thread::sleep(Duration::from_millis(10));
    }
    // Its log line says so.
    server.log_when("for the cancelled stream", Duration::from_secs(60), |log| {
        log.iter().any(|l| l.contains(" 200 ") && l.contains("finish=cancelled stream"))
    });
}

#[cfg(unix)]
#[test]
fn sigterm_finishes_running_requests_then_exits_0() {
    let dir = tempdir();
    let server = Server::start(&tiny_model(dir.path()), &[]);
    let url = format!("{}/v1/completions", server.base);
    let r = agent()
        .post(&url)
        .send(json!({"prompt": "x", "max_tokens": 400, "ignore_eos": true, "stream": true}).to_string().as_bytes())
        .unwrap();
    let mut reader = BufReader::new(r.into_body().into_reader());
    let mut line = String::new();
    reader.read_line(&mut line).unwrap();
    let reading = std::thread::spawn(move || {
        let mut rest = String::new();
        reader.read_to_string(&mut rest).unwrap();
        rest
    });
    let (code, log) = server.terminate();
    let rest = reading.join().unwrap();
    assert_eq!(code, Some(0), "{log:#?}");
    assert!(rest.trim_end().ends_with("data: [DONE]"), "the running stream was cut off: {rest}");
    let done = rest.lines().filter_map(|l| l.strip_prefix("data: ")).rfind(|d| d.contains("usage")).unwrap();
    let done: Value = serde_json::from_str(done).unwrap();
    assert_eq!(done["usage"]["completion_tokens"], 400);
    assert!(log.iter().any(|l| l.starts_with("shutting down")), "{log:#?}");
}

const SYSTEM: &str = "You are a helpful assistant for a geography quiz. Answer every question with one short, correct \
    sentence. Do not add explanations, lists or follow-up questions. If you are asked about a capital city, name the \
    city and the country it belongs to.";

/// The issue's first demonstration: sixteen concurrent chat requests to SmolLM2, half streamed, sharing a system
/// prompt, all answered sensibly; the prefix cache served some of their prompts; a malformed request in the middle
/// gets a 400 and the server carries on.
#[test]
fn sixteen_concurrent_chats_on_smollm2_share_the_system_prompt() {
    let Some(model) = real_model("smollm2") else { return };
    let server = Server::start(&model, &[]);
    let url = format!("{}/v1/chat/completions", server.base);
    let questions = [
        ("France", "Paris"),
        ("Germany", "Berlin"),
        ("Italy", "Rome"),
        ("Japan", "Tokyo"),
        ("Russia", "Moscow"),
        ("China", "Beijing"),
        ("Egypt", "Cairo"),
        ("Greece", "Athens"),
    ];
    let handles: Vec<_> = (0..16)
        .map(|i| {
            let (country, city) = questions[i % 8];
            let url = url.clone();
            let streamed = i % 2 == 1;
            std::thread::spawn(move || {
                let body = json!({
                    "model": "smollm2",
                    "messages": [{"role": "system", "content": SYSTEM},
                                 {"role": "user", "content": format!("What is the capital of {country}?")}],
                    "max_tokens": 40,
                    "temperature": 0,
                    "stream": streamed,
                });
                let text = if streamed {
                    let events = stream(&url, &body);
                    assert_eq!(events.last().map(String::as_str), Some("[DONE]"));
                    events[..events.len() - 1]
                        .iter()
                        .map(|e| serde_json::from_str::<Value>(e).unwrap())
                        .filter_map(|c| c["choices"][0]["delta"]["content"].as_str().map(str::to_string))
                        .collect::<String>()
                } else {
                    let (status, _, body) = post(&url, body.to_string().as_bytes());
                    assert_eq!(status, 200, "{body}");
                    let v: Value = serde_json::from_str(&body).unwrap();
                    v["choices"][0]["message"]["content"].as_str().unwrap().to_string()
                };
                (country, city, streamed, text)
            })
        })
        .collect();
    let (status, _, body) = post(&url, br#"{"messages": [{"role": "user", "content": "hi"}], "max_tokens": -5}"#);
    assert_eq!(status, 400, "{body}");
    for h in handles {
        let (country, city, streamed, text) = h.join().unwrap();
        eprintln!("{country} (streamed {streamed}): {text:?}");
        assert!(text.contains(city), "the capital of {country}: {text:?}");
    }
    let (_, metrics) = get(&format!("{}/metrics", server.base));
    let hits = metric(&metrics, "infer_prefix_cache_hit_tokens_total");
    eprintln!("prefix-cache hit tokens: {hits}");
    assert!(hits > 0.0, "{metrics}");
    assert_eq!(metric(&metrics, "infer_requests_finished_total"), 16.0);
    assert_eq!(metric(&metrics, "infer_requests_running"), 0.0);
    let (status, _) = get(&format!("{}/health", server.base));
    assert_eq!(status, 200);
}

/// The official `openai` Python package, unchanged, against the server: a whole response and a stream.
#[test]
fn the_openai_python_client_works_unchanged() {
    if !crate::common::python_module("openai") {
        return;
    }
    let dir = tempdir();
    let server = Server::start(&tiny_model(dir.path()), &["--chat-template", "chatml"]);
    let script = r#"
import sys
from openai import OpenAI
client = OpenAI(base_url=sys.argv[1] + "/v1", api_key="unused")
models = client.models.list()
name = models.data[0].id
r = client.chat.completions.create(model=name, messages=[{"role": "user", "content": "hello"}],
                                   max_tokens=8, temperature=0, extra_body={"ignore_eos": True})
assert r.choices[0].finish_reason == "length", r
assert r.usage.completion_tokens == 8, r.usage
whole = r.choices[0].message.content
parts = []
for chunk in client.chat.completions.create(model=name, messages=[{"role": "user", "content": "hello"}],
                                            max_tokens=8, temperature=0, stream=True,
                                            stream_options={"include_usage": True}, extra_body={"ignore_eos": True}):
    if chunk.choices and chunk.choices[0].delta.content:
        parts.append(chunk.choices[0].delta.content)
    if chunk.usage:
        assert chunk.usage.completion_tokens == 8, chunk.usage
assert "".join(parts) == whole, ("".join(parts), whole)
c = client.completions.create(model=name, prompt="abc", max_tokens=4, temperature=0, extra_body={"ignore_eos": True})
assert c.usage.completion_tokens == 4 and c.choices[0].finish_reason == "length", c
c = client.chat.completions.create(model=name, messages=[{"role": "user", "content": "hello"}], max_tokens=4, n=3,
                                   extra_body={"ignore_eos": True})
assert [x.index for x in c.choices] == [0, 1, 2] and c.usage.completion_tokens == 12, c
try:
    client.completions.create(model=name, prompt="abc", max_tokens=4, n=17)
    raise SystemExit("n=17 should have been refused")
except Exception as e:
    assert getattr(e, "status_code", None) == 400, e
print("ok", repr(whole))
"#;
    let out = std::process::Command::new("python3").args(["-c", script, &server.base]).output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    assert!(stdout.starts_with("ok "), "{stdout}");
}

/// `infer bench --serve`: the load generator against `infer serve` on a tiny model, a concurrency sweep and a
/// Poisson rate, synthetic and JSONL prompts; every request counted, every figure there.
#[test]
fn the_load_generator_reports_vllm_style_figures() {
    let dir = tempdir();
    let server = Server::start(&tiny_model(dir.path()), &["--chat-template", "chatml"]);
    let run = |extra: &[&str]| -> Vec<Value> {
        let mut args = vec!["bench", "--serve", &server.base, "--gen-len", "8", "--ignore-eos", "-o", "json"];
        args.extend_from_slice(extra);
        let out = crate::common::infer(&args);
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        serde_json::from_slice(&out.stdout).expect("a JSON array")
    };
    let sweep = run(&["--concurrency", "1,3", "--num-prompts", "6", "--prompt-len", "12", "--shared-prefix", "20"]);
    assert_eq!(sweep.len(), 2);
    for (r, c) in sweep.iter().zip([1, 3]) {
        assert_eq!(r["max_concurrency"], c);
        assert_eq!((r["completed"].as_u64(), r["failed"].as_u64()), (Some(6), Some(0)), "{r}");
        assert_eq!(r["total_output_tokens"], 48);
        // The synthetic vocabulary spells words byte by byte: 20 + 12 words are well over 32 tokens.
        assert!(r["total_input_tokens"].as_u64().unwrap() > 6 * 32, "{r}");
        for key in ["ttft_ms", "tpot_ms", "itl_ms", "e2el_ms"] {
            let s = &r[key];
            assert!(
                s["mean"].as_f64().unwrap() > 0.0 && s["p99"].as_f64().unwrap() >= s["median"].as_f64().unwrap(),
                "{key}: {s}"
            );
        }
        assert!(r["output_throughput"].as_f64().unwrap() > 0.0);
        assert_eq!(r["output_lens"].as_array().unwrap().len(), 6);
    }
    let file = dir.path().join("prompts.jsonl");
    std::fs::write(
        &file,
        "\"hello there\"\n{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], \"max_tokens\": 3}\n",
    )
    .unwrap();
    let poisson =
        run(&["--rate", "40", "--num-prompts", "5", "--endpoint", "chat", "--prompts", file.to_str().unwrap()]);
    let r = &poisson[0];
    assert_eq!((r["completed"].as_u64(), r["request_rate"].as_f64()), (Some(5), Some(40.0)), "{r}");
    // Three prompts use the default 8 tokens, two the file's 3.
    assert_eq!(r["total_output_tokens"], 3 * 8 + 2 * 3);
    assert!(r["max_concurrency"].is_null());
    // The text report.
    let out = crate::common::infer(&[
        "bench",
        "--serve",
        &server.base,
        "--num-prompts",
        "2",
        "--gen-len",
        "4",
        "--label",
        "tiny",
    ]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("=== tiny ===")
            && text.contains("Output token throughput (tok/s):")
            && text.contains("P99 ITL (ms):"),
        "{text}"
    );
    // Bad flags.
    for (args, needle) in [
        (vec!["bench", "--serve", "ftp://x"], "http://"),
        (vec!["bench", "--serve", &server.base, "--rate", "0"], "rate"),
        (vec!["bench", "--serve", &server.base, "-p", "5"], "do not apply"),
        (vec!["bench", "--concurrency", "4"], "--serve"),
        (vec!["bench", "--serve", "http://127.0.0.1:1"], "connecting"),
    ] {
        let out = crate::common::infer(&args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success() && stderr.contains(needle) && !stderr.contains("panicked"), "{args:?}: {stderr}");
    }
}
