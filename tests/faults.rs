//! The runtime faults R1-R15 of `../shared/RELIABILITY.md` §2, against the `infer` binary: each test names the
//! fault it covers. They run on a tiny synthetic model (fast, and its noise of a vocabulary emits every byte), so
//! the faults are exercised without minutes of real-model generation; the real models are covered by the
//! `run`/`chat` tests this file points to where they already test a fault.

use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use infer::gguf::GgufFile;
use infer::kernels::GgmlType;
use infer::tokenizer::Tokenizer;

use crate::common::{assert_clean_failure, infer, infer_bin, interrupt, tempdir};
use crate::registry::{fake_model, listing, local_source, read_request, toml_entry};
use crate::serve;
use crate::synthetic::{Spec, build};

/// A synthetic llama model written into `dir`.
fn tiny(dir: &Path) -> PathBuf {
    let path = dir.join("tiny.gguf");
    build(Spec::llama(GgmlType::Q8_0), 7).write_file(&path).unwrap();
    path
}

fn spawn(args: &[&str], stdin: Stdio) -> Child {
    infer_bin().args(args).stdin(stdin).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap()
}

/// Feeds `input` to a command's stdin and returns its output.
fn with_stdin(args: &[&str], input: &[u8]) -> Output {
    let mut child = spawn(args, Stdio::piped());
    let mut stdin = child.stdin.take().unwrap();
    let input = input.to_vec();
    // A writer thread: a command that refuses its input early closes the pipe, which must not block the test.
    let writer = std::thread::spawn(move || {
        let _ = stdin.write_all(&input);
    });
    let out = child.wait_with_output().unwrap();
    let _ = writer.join();
    out
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// Waits for `child` to exit, killing it (and failing) after `limit`: nothing here may hang. Its output is read
/// meanwhile, so that a command printing more than a pipe holds is not blocked by the test.
fn wait_at_most(mut child: Child, limit: Duration) -> Output {
    fn drain(pipe: Option<impl Read + Send + 'static>) -> std::thread::JoinHandle<Vec<u8>> {
        std::thread::spawn(move || {
            let mut bytes = Vec::new();
            if let Some(mut pipe) = pipe {
                let _ = pipe.read_to_end(&mut bytes);
            }
            bytes
        })
    }
    let (stdout, stderr) = (drain(child.stdout.take()), drain(child.stderr.take()));
    let start = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if start.elapsed() > limit {
            let _ = child.kill();
            panic!("the command did not finish within {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    Output { status, stdout: stdout.join().unwrap(), stderr: stderr.join().unwrap() }
}

/// R1: a prompt longer than the context is refused with both counts (run), or refused and the chat goes on.
/// (tests/chat.rs drops the oldest exchanges under the default policy.)
#[test]
fn r01_a_prompt_longer_than_the_context() {
    let dir = tempdir();
    let m = tiny(dir.path());
    let m = m.to_str().unwrap();
    let long = "word ".repeat(200);
    assert_clean_failure(&infer(&["run", m, "-p", &long, "-c", "32"]), "but the context holds 32");
    let out = with_stdin(&["chat", m, "-c", "64", "-n", "4", "--on-full", "error"], format!("{long}\nhi\n").as_bytes());
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(text(&out.stderr).contains("error:"), "the long message is refused: {}", text(&out.stderr));
    // Every reply, even an empty one, ends its line.
    assert!(!out.stdout.is_empty(), "the next message is answered");
}

/// R2: when the context fills during generation, generation stops with finish_reason `length` and a note.
#[test]
fn r02_the_context_fills_during_generation() {
    let dir = tempdir();
    let m = tiny(dir.path());
    let out = infer(&["run", m.to_str().unwrap(), "-p", "abc", "-c", "24", "-n", "500", "--ignore-eos", "--json"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let v: serde_json::Value = serde_json::from_str(text(&out.stdout).trim()).unwrap();
    assert_eq!(v["finish_reason"], "length");
    // Every position holds a token, and one more is sampled from the last one's logits.
    let total = v["prompt_tokens"].as_u64().unwrap() + v["tokens"].as_array().unwrap().len() as u64;
    assert_eq!(total, 24 + 1, "generated up to the full context");
    assert!(text(&out.stderr).contains("the context (24 tokens) is full"), "{}", text(&out.stderr));
}

/// R3: input past the caps is refused with a message before it is tokenized (and without reading it all).
#[test]
fn r03_huge_input_is_refused() {
    let dir = tempdir();
    let m = tiny(dir.path());
    let m = m.to_str().unwrap();
    let huge = vec![b'a'; (64 << 20) + 1];
    assert_clean_failure(&with_stdin(&["run", m, "-n", "1"], &huge), "larger than the 64 MiB limit");
    assert_clean_failure(&with_stdin(&["tokenize", m], &huge), "larger than the 64 MiB limit");
    let file = dir.path().join("huge.txt");
    std::fs::write(&file, &huge).unwrap();
    assert_clean_failure(&infer(&["run", m, "-f", file.to_str().unwrap()]), "more than the 64 MiB limit");
    let mut line = vec![b'['; (64 << 20) + 2];
    line.push(b'\n');
    assert_clean_failure(&with_stdin(&["logits", m], &line), "stdin line 1 is longer than 64 MiB");
    // A chat line longer than its 16 MiB cap is skipped with an error; the chat goes on.
    let mut input = vec![b'x'; (16 << 20) + 10];
    input.extend(b"\nhi\n");
    let out = with_stdin(&["chat", m, "-n", "2"], &input);
    assert!(out.status.success());
    assert!(text(&out.stderr).contains("stdin line 1 is longer than"), "{}", text(&out.stderr));
}

/// R4: a character split across tokens is held back until it completes; what a stream prints is always UTF-8.
#[test]
fn r04_split_utf8_in_streamed_output() {
    let file = GgufFile::from_bytes(build(Spec::llama(GgmlType::Q8_0), 7).to_bytes().unwrap()).unwrap();
    let tok = Tokenizer::from_gguf(&file).unwrap();
    // "é" is C3 A9: two byte tokens in this byte-level vocabulary.
    let (a, b) = (tok.bpe_id_of_bytes(&[0xC3]).unwrap(), tok.bpe_id_of_bytes(&[0xA9]).unwrap());
    let mut dec = tok.stream_decoder(false);
    assert_eq!(dec.push(a), "");
    assert_eq!(dec.push(b), "é");
    assert_eq!(dec.push(a), "");
    assert_eq!(dec.finish(), "\u{FFFD}", "an unfinished character at the end becomes U+FFFD");
    // Random weights sample random bytes: the printed text must still be valid UTF-8.
    let dir = tempdir();
    let m = tiny(dir.path());
    for seed in ["1", "2", "3"] {
        let out =
            infer(&["run", m.to_str().unwrap(), "-p", "x", "-n", "120", "--ignore-eos", "--temp", "2", "--seed", seed]);
        assert!(out.status.success());
        assert!(String::from_utf8(out.stdout).is_ok(), "seed {seed}: stdout is not UTF-8");
    }
}

/// R5: input that is not UTF-8 is refused (with the offset) or, in a chat, skipped with an error.
#[test]
fn r05_non_utf8_input() {
    let dir = tempdir();
    let m = tiny(dir.path());
    let m = m.to_str().unwrap();
    let bad = b"caf\xe9 au lait\n";
    assert_clean_failure(
        &with_stdin(&["run", m, "-n", "1"], bad),
        "not valid UTF-8 (the first bad byte is at offset 3)",
    );
    assert_clean_failure(&with_stdin(&["tokenize", m], bad), "not valid UTF-8");
    assert_clean_failure(&with_stdin(&["tokenize", m, "--jsonl"], b"\"ok\"\n\xff\n"), "stdin line 2");
    let out = with_stdin(&["chat", m, "-n", "2"], b"\xff\xfe\nhi\n");
    assert!(out.status.success());
    assert!(text(&out.stderr).contains("stdin line 1 is not valid UTF-8; skipped"), "{}", text(&out.stderr));
    // A prompt argument that is not UTF-8 is refused by the argument parser.
    #[cfg(unix)]
    {
        use std::os::unix::ffi::OsStrExt;
        let out = infer_bin().args(["run", m, "-p"]).arg(std::ffi::OsStr::from_bytes(b"\xff")).output().unwrap();
        assert!(!out.status.success() && out.status.code() != Some(101), "{}", text(&out.stderr));
    }
}

/// R6: Ctrl-C stops generation and keeps the text (run), stops a reply and ends a piped chat with status 0, and ends a bench
/// after printing the tests it finished (exit 130). Terminal chat: tests/chat.rs; run on SmolLM2: tests/run.rs.
#[test]
fn r06_ctrl_c_in_run_chat_and_bench() {
    let dir = tempdir();
    let m = tiny(dir.path());
    let m = m.to_str().unwrap();
    // run: the JSON is still printed, finish_reason cancelled. Ctrl-C once a token is decoded (the timeline's mark):
    // the handler is in place by then, and generation under way.
    let out = interrupt_when(
        spawn_with_timeline(&["run", m, "-p", "x", "-n", "100000000", "--ignore-eos", "-c", "100000", "--json"]),
        DECODED,
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    let v: serde_json::Value = serde_json::from_str(text(&out.stdout).trim()).unwrap();
    assert_eq!(v["finish_reason"], "cancelled");
    // piped chat: the reply stops and the chat ends (status 0) before the rest of its input, with a note. (The
    // noise model may end a reply at once, so there are many messages to keep it talking.)
    let messages = 400;
    let mut child = spawn(&["chat", m, "-n", "200", "-c", "100000"], Stdio::piped());
    child.stdin.take().unwrap().write_all("first\n".repeat(messages).as_bytes()).unwrap();
    let mut stdout = child.stdout.take().unwrap();
    let mut printed = vec![0u8; 64];
    stdout.read_exact(&mut printed).unwrap();
    interrupt(&child);
    stdout.read_to_end(&mut printed).unwrap();
    let out = wait_at_most(child, Duration::from_secs(20));
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(text(&out.stderr).contains("note: interrupted"), "{}", text(&out.stderr));
    let replies = text(&printed).matches("\n\n").count();
    assert!(replies < messages - 1, "the chat went on after Ctrl-C ({replies} replies)");
    // bench: the finished tests are printed, then the note; status 130.
    // Tests that take longer and longer (pp1 .. pp250, about a minute in all), so that Ctrl-C lands after some and
    // before the last. (bench shows its progress only on a terminal, so this one waits a fixed time: the first
    // test, 200 runs of one token on the tiny model, takes well under it.)
    let tests = 250;
    let sizes: Vec<String> = (1..=tests).map(|n| n.to_string()).collect();
    let child = spawn(&["bench", m, "-p", &sizes.join(","), "-n", "0", "-r", "200", "-o", "jsonl"], Stdio::null());
    std::thread::sleep(Duration::from_millis(3000));
    interrupt(&child);
    let out = wait_at_most(child, Duration::from_secs(30));
    assert_eq!(out.status.code(), Some(130), "{}", text(&out.stderr));
    assert!(text(&out.stderr).contains("note: interrupted"));
    let lines: Vec<serde_json::Value> =
        text(&out.stdout).lines().map(|l| serde_json::from_str(l).expect("complete JSON records")).collect();
    assert!(!lines.is_empty() && lines.len() < tests, "the finished tests only: {} of {tests}", lines.len());
}

/// The timeline's mark for each forward pass of a generation (with `INFER_TIMELINE` set): a token was sampled.
pub(crate) const DECODED: &str = " decoded ";

/// Spawns `infer` (stdin empty, stdout and stderr piped) with `INFER_TIMELINE` set, so that it marks its progress on
/// stderr (the model loaded, each token decoded) for [`interrupt_when`] to wait for.
pub(crate) fn spawn_with_timeline(args: &[&str]) -> Child {
    infer_bin()
        .env("INFER_TIMELINE", "1")
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// Sends Ctrl-C once `child`'s stderr has shown `needle` (the command is under way), and returns its output, stderr
/// from the start. Nothing may take more than 10 s to stop.
pub(crate) fn interrupt_when(mut child: Child, needle: &str) -> Output {
    let mut stderr = child.stderr.take().unwrap();
    let mut seen = Vec::new();
    let mut buf = [0u8; 4096];
    while !text(&seen).contains(needle) {
        let n = stderr.read(&mut buf).unwrap();
        assert!(n > 0, "the command ended before printing {needle:?}: {}", text(&seen));
        seen.extend_from_slice(&buf[..n]);
    }
    interrupt(&child);
    let rest = std::thread::spawn(move || {
        let mut bytes = Vec::new();
        let _ = stderr.read_to_end(&mut bytes);
        bytes
    });
    let mut out = wait_at_most(child, Duration::from_secs(10));
    seen.extend(rest.join().unwrap());
    out.stderr = seen;
    out
}

/// A text of about a million tokens for the tiny model's byte vocabulary: tens of thousands of chunks, far more
/// than a run can score before the Ctrl-C that follows its first chunk.
fn long_text(dir: &Path) -> PathBuf {
    let path = dir.join("long.txt");
    std::fs::write(&path, "the quick brown fox jumps over the lazy dog. ".repeat(22_000)).unwrap();
    path
}

/// R6 for `perplexity` and `compare`: Ctrl-C stops after the chunk in progress, the chunks finished are reported
/// (stdout: the estimate, or the table with the statistics so far), and the status is 130.
#[test]
fn r06_ctrl_c_in_perplexity_and_compare() {
    let dir = tempdir();
    let m = tiny(dir.path());
    let m = m.to_str().unwrap();
    let t = long_text(dir.path());
    let t = t.to_str().unwrap();
    // perplexity: its running estimate goes to stderr after each chunk ("[1]...,").
    let out = interrupt_when(spawn(&["perplexity", m, "-f", t, "-c", "16"], Stdio::null()), "[1]");
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(130), "{err}");
    assert!(!err.contains("panicked") && err.trim_end().ends_with("note: interrupted"), "{err}");
    let summary = err.lines().find(|l| l.contains("chunks of 16 tokens (interrupted)")).expect(&err);
    let (done, planned): (usize, usize) = {
        let w: Vec<&str> = summary.split_whitespace().collect();
        (w[0].parse().unwrap(), w[2].parse().unwrap())
    };
    assert!(done >= 1 && done < planned, "{summary}");
    assert_eq!(err.matches(']').count(), done, "one running estimate per chunk finished: {err}");
    let stdout = text(&out.stdout);
    assert!(stdout.starts_with("Final estimate: PPL = "), "the estimate of the chunks finished: {stdout:?}");
    // compare: progress "chunk i/n" on stderr; the table says how many chunks it covers.
    let out = interrupt_when(spawn(&["compare", m, m, "-f", t, "-c", "16"], Stdio::null()), "chunk 1/");
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(130), "{err}");
    assert!(!err.contains("panicked") && err.trim_end().ends_with("note: interrupted"), "{err}");
    let stdout = text(&out.stdout);
    let line = stdout.lines().find(|l| l.starts_with("scored positions")).expect(&stdout);
    assert!(line.contains(" chunks: interrupted)"), "{line}");
    // The same model on both sides: every scored position agrees.
    assert!(stdout.lines().any(|l| l.starts_with("top1_agreement") && l.ends_with("1.0000")), "{stdout}");
}

/// Opens a streamed completion that generates until its context (100,000 tokens) is full, and returns its reader
/// after the first event: the request is running.
fn endless_stream(base: &str) -> BufReader<impl Read + Send + 'static> {
    let body = serde_json::json!({"prompt": "x", "max_tokens": 100000, "ignore_eos": true, "stream": true});
    let r = serve::agent().post(&format!("{base}/v1/completions")).send(body.to_string().as_bytes()).unwrap();
    assert_eq!(r.status().as_u16(), 200);
    let mut reader = BufReader::new(r.into_body().into_reader());
    let mut line = String::new();
    reader.read_line(&mut line).unwrap();
    assert!(line.starts_with("data: "), "{line}");
    reader
}

/// Reads a stream to its end (the server closing it) and returns what came.
fn read_rest(mut reader: impl Read + Send + 'static) -> std::thread::JoinHandle<String> {
    std::thread::spawn(move || {
        let mut bytes = Vec::new();
        let _ = reader.read_to_end(&mut bytes);
        text(&bytes)
    })
}

/// R6 for `serve`: Ctrl-C (SIGINT, like SIGTERM) is its normal way to stop, so it exits 0, not 130: it stops
/// accepting connections, lets running requests finish for --shutdown-timeout seconds, then cuts off the rest; a
/// second Ctrl-C stops the wait at once. Either way it is gone within 10 s here.
#[cfg(unix)]
#[test]
fn r06_ctrl_c_in_serve_with_requests_in_flight() {
    let dir = tempdir();
    let m = serve::tiny_model(dir.path());
    // A short request finishes during the drain; an endless one is cut off at the deadline.
    let server = serve::Server::start(&m, &["-c", "100000", "--shutdown-timeout", "3"]);
    let endless = endless_stream(&server.base);
    let short = serve::agent()
        .post(&format!("{}/v1/completions", server.base))
        .send(
            serde_json::json!({"prompt": "y", "max_tokens": 40, "ignore_eos": true, "stream": true})
                .to_string()
                .as_bytes(),
        )
        .unwrap();
    let short = read_rest(short.into_body().into_reader());
    let endless = read_rest(endless);
    server.signal("INT");
    let (code, log) = server.wait_exit(Duration::from_secs(10));
    assert_eq!(code, Some(0), "{log:#?}");
    let short = short.join().unwrap();
    assert!(short.trim_end().ends_with("data: [DONE]"), "the short request was cut off: {short}");
    let endless = endless.join().unwrap();
    assert!(!endless.contains("[DONE]"), "the endless request cannot have ended");
    assert!(log.iter().any(|l| l.starts_with("shutting down")), "{log:#?}");
    assert!(log.iter().any(|l| l.starts_with("shutdown deadline passed")), "{log:#?}");
    assert!(!log.iter().any(|l| l.contains("panicked")), "{log:#?}");

    // Twice: the second Ctrl-C ends the (default, 30 s) wait.
    let server = serve::Server::start(&m, &["-c", "100000"]);
    let endless = read_rest(endless_stream(&server.base));
    server.signal("INT");
    server.log_when("of shutting down after SIGINT", Duration::from_secs(10), |log| {
        log.iter().any(|l| l.starts_with("shutting down"))
    });
    server.signal("INT");
    let (code, log) = server.wait_exit(Duration::from_secs(10));
    assert_eq!(code, Some(0), "{log:#?}");
    assert!(!endless.join().unwrap().contains("[DONE]"));
}

/// A client that goes away mid-request (streamed or not): the engine cancels its request and frees its place, and
/// the server goes on answering.
#[test]
fn serve_a_client_that_goes_away_cancels_its_request() {
    let dir = tempdir();
    let m = serve::tiny_model(dir.path());
    let server = serve::Server::start(&m, &["-c", "100000"]);
    let metrics = || serve::get(&format!("{}/metrics", server.base)).1;
    let wait_for = |what: &str, ok: &dyn Fn(&str) -> bool| {
        let start = Instant::now();
        while !ok(&metrics()) {
            assert!(start.elapsed() < Duration::from_secs(10), "{what}: {}", metrics());
            std::thread::sleep(Duration::from_millis(20));
        }
    };
    drop(endless_stream(&server.base));
    wait_for("the dropped stream was not cancelled", &|t| {
        serve::metric(t, "infer_requests_cancelled_total") == 1.0 && serve::metric(t, "infer_requests_running") == 0.0
    });
    // Not streamed: the client gives up after 300 ms.
    let impatient = ureq::Agent::new_with_config(
        ureq::Agent::config_builder().timeout_global(Some(Duration::from_millis(300))).build(),
    );
    let body = serde_json::json!({"prompt": "x", "max_tokens": 100000, "ignore_eos": true});
    let r = impatient.post(&format!("{}/v1/completions", server.base)).send(body.to_string().as_bytes());
    assert!(r.is_err(), "a 100,000-token reply in 300 ms?");
    wait_for("the abandoned request was not cancelled", &|t| {
        serve::metric(t, "infer_requests_cancelled_total") == 2.0 && serve::metric(t, "infer_requests_running") == 0.0
    });
    assert_eq!(serve::get(&format!("{}/health", server.base)), (200, r#"{"status":"ok"}"#.to_string()));
    let (status, _, reply) =
        serve::post(&format!("{}/v1/completions", server.base), br#"{"prompt": "hi", "max_tokens": 3}"#);
    assert_eq!(status, 200, "{reply}");
    // Both cancelled requests are logged as such: the stream (200 sent before it ended) and the one never answered.
    let stream_line = |l: &String| l.contains(" 200 ") && l.contains("finish=cancelled stream");
    let dropped_line = |l: &String| l.contains(" 499 ") && l.contains("finish=cancelled");
    server.log_when("for both cancelled requests", Duration::from_secs(30), |log| {
        log.iter().any(stream_line) && log.iter().any(dropped_line)
    });
}

/// R7 for `serve`: it prints nothing on stdout, and its log goes to stderr; a log whose reader went away (a closed
/// pipe) loses its lines, not the requests, and the server still stops cleanly.
#[cfg(unix)]
#[test]
fn r07_serve_with_its_log_on_a_closed_pipe() {
    let dir = tempdir();
    let m = serve::tiny_model(dir.path());
    let mut child = spawn(&["serve", m.to_str().unwrap(), "--port", "0", "-t", "2"], Stdio::null());
    let mut stderr = BufReader::new(child.stderr.take().unwrap());
    let mut line = String::new();
    let addr = loop {
        line.clear();
        assert!(stderr.read_line(&mut line).unwrap() > 0, "the server did not start");
        if let Some(rest) = line.strip_prefix("listening on http://") {
            break rest.split_whitespace().next().unwrap().to_string();
        }
    };
    drop(stderr);
    let base = format!("http://{addr}");
    for _ in 0..3 {
        let (status, _, reply) =
            serve::post(&format!("{base}/v1/completions"), br#"{"prompt": "hi", "max_tokens": 3}"#);
        assert_eq!(status, 200, "{reply}");
        let (status, _, reply) = serve::post(&format!("{base}/v1/completions"), br#"{"prompt": 5}"#);
        assert_eq!(status, 400, "{reply}");
    }
    interrupt(&child);
    let out = wait_at_most(child, Duration::from_secs(10));
    assert_eq!(out.status.code(), Some(0), "{:?}", out.status);
    assert!(out.stdout.is_empty());
}

/// R6 for the commands that answer stdin line by line (`logits`, `tokenize --jsonl`): they install no Ctrl-C handler
/// on purpose. They wait in a read of stdin between lines, where a handler's flag would go unseen until the next
/// line came (a Ctrl-C that does nothing); with nothing to finish or save, the default action, ending at once (the
/// shell reports 130), is the right one. Every line answered before it is whole. (`info`, `list` and `tokenize -p`
/// are done in milliseconds, on the same default.)
#[cfg(unix)]
#[test]
fn r06_ctrl_c_in_logits_and_tokenize() {
    use std::os::unix::process::ExitStatusExt;
    let dir = tempdir();
    let m = tiny(dir.path());
    let m = m.to_str().unwrap();
    for (args, line) in
        [(vec!["logits", m, "--top-k", "3"], "[1, 2, 3]\n"), (vec!["tokenize", m, "--jsonl"], "\"hi\"\n")]
    {
        let mut child = spawn(&args, Stdio::piped());
        let mut stdin = child.stdin.take().unwrap();
        stdin.write_all(line.as_bytes()).unwrap();
        let mut stdout = BufReader::new(child.stdout.take().unwrap());
        let mut answer = String::new();
        stdout.read_line(&mut answer).unwrap();
        serde_json::from_str::<serde_json::Value>(&answer).unwrap_or_else(|e| panic!("{args:?}: {e}: {answer}"));
        // Waiting for the next line (stdin still open).
        interrupt(&child);
        let out = wait_at_most(child, Duration::from_secs(10));
        assert_eq!(out.status.signal(), Some(2), "{args:?}: {:?} {}", out.status, text(&out.stderr));
        assert!(!text(&out.stderr).contains("panicked"), "{}", text(&out.stderr));
        drop(stdin);
    }
}

/// R6 and R7 for `pull`: Ctrl-C mid-download ends it at once (default action: the download is a temporary file,
/// which the next pull removes before it starts again), and a closed stdout (where it prints the path) does not
/// fail a pull that worked.
#[cfg(unix)]
#[test]
fn r06_r07_ctrl_c_and_broken_pipe_in_pull() {
    use std::os::unix::process::ExitStatusExt;
    let dir = tempdir();
    let home = dir.path().join("home");
    let models = home.join("models");
    std::fs::create_dir_all(&models).unwrap();
    let bytes = fake_model(1_000_000, 3);
    // A server that sends half the file and stalls, then (the next connection) all of it.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let body = bytes.clone();
    std::thread::spawn(move || {
        // The stalled connection stays open (held here) while the next one is served.
        let mut held = Vec::new();
        for half in [true, false] {
            let Ok((mut stream, _)) = listener.accept() else { return };
            read_request(&mut stream);
            let head = format!("HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n", body.len());
            let _ = stream.write_all(head.as_bytes());
            let _ = stream.write_all(if half { &body[..body.len() / 2] } else { &body });
            held.push(stream);
        }
    });
    let mut entry = local_source(dir.path(), "slow", &bytes);
    entry.source = infer::registry::Source::Url { url: format!("http://{addr}/slow.gguf") };
    std::fs::write(home.join("models.toml"), toml_entry(&entry)).unwrap();
    let pull = || {
        Command::new(env!("CARGO_BIN_EXE_infer"))
            .args(["pull", "slow"])
            .env("INFER_HOME", &home)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    };
    let child = pull();
    let partial = || listing(&models).into_iter().find(|n| n.ends_with(".partial"));
    let start = Instant::now();
    while !partial().is_some_and(|p| std::fs::metadata(models.join(p)).is_ok_and(|m| m.len() > 0)) {
        assert!(start.elapsed() < Duration::from_secs(20), "no download started: {:?}", listing(&models));
        std::thread::sleep(Duration::from_millis(20));
    }
    interrupt(&child);
    let out = wait_at_most(child, Duration::from_secs(10));
    assert_eq!(out.status.signal(), Some(2), "{:?} {}", out.status, text(&out.stderr));
    // The next pull, its stdout closed before it prints: the file is fetched whole, the leftover removed, status 0.
    let mut child = pull();
    drop(child.stdout.take());
    let out = wait_at_most(child, Duration::from_secs(30));
    assert!(out.status.success(), "{:?} {}", out.status, text(&out.stderr));
    assert_eq!(listing(&models), [".locks", "slow.gguf", "slow.gguf.sha256"]);
    assert_eq!(std::fs::read(models.join("slow.gguf")).unwrap(), bytes);
}

/// R7: `| head` on every command that prints: a closed stdout (or stderr) ends the command quietly with status 0.
/// (`serve` and `pull`: the tests after this one.)
#[test]
fn r07_broken_pipe_on_every_command_that_prints() {
    let dir = tempdir();
    let m = tiny(dir.path());
    let m = m.to_str().unwrap();
    let ids = format!("{}\n", serde_json::to_string(&(0..200).collect::<Vec<u32>>()).unwrap()).repeat(20);
    let words = "hello world ".repeat(5000);
    let text_file = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/jargon-intro.txt");
    let quantized = dir.path().join("q4_0.gguf").to_str().unwrap().to_string();
    let commands: Vec<(Vec<&str>, Vec<u8>)> = vec![
        (vec!["info", m, "--full"], vec![]),
        (vec!["list"], vec![]),
        (vec!["tokenize", m, "--pieces", "-p", &words], vec![]),
        (vec!["tokenize", m, "--jsonl"], "\"hello\"\n".repeat(20000).into_bytes()),
        (vec!["run", m, "-p", "x", "-n", "5000", "--ignore-eos", "-c", "8192"], vec![]),
        (vec!["chat", m, "-n", "300"], "hi\n".repeat(200).into_bytes()),
        (vec!["logits", m, "--top-k", "200"], ids.into_bytes()),
        (vec!["bench", m, "-p", "8", "-n", "4", "-r", "1", "-t", "1,2", "-o", "csv"], vec![]),
        (vec!["perplexity", m, "-f", text_file, "-c", "32", "--chunks", "40"], vec![]),
        (vec!["compare", m, m, "-f", text_file, "-c", "32", "--chunks", "40"], vec![]),
        // Prints nothing on stdout: its per-tensor lines (-v) go to stderr, which the second round closes.
        (vec!["quantize", m, &quantized, "q4_0", "--allow-requantize", "-v"], vec![]),
    ];
    for (args, input) in &commands {
        let mut child = spawn(args, if input.is_empty() { Stdio::null() } else { Stdio::piped() });
        feed(&mut child, input);
        // Read one line and hang up, as `| head -1` does.
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).unwrap();
        let out = wait_at_most(child, Duration::from_secs(60));
        assert!(out.status.success(), "{args:?}: {:?} {}", out.status, text(&out.stderr));
        assert!(
            !text(&out.stderr).contains("panicked") && !text(&out.stderr).contains("error"),
            "{args:?}: {}",
            text(&out.stderr)
        );
    }
    // `2>&1 | head -c 1`: stdout and stderr on one pipe, closed after the first byte. The notes, progress and
    // timings on stderr used to panic there (`eprintln!`, status 101).
    for (args, input) in &commands {
        let (mut reader, writer) = std::io::pipe().unwrap();
        let mut child = infer_bin()
            .args(args)
            .stdin(if input.is_empty() { Stdio::null() } else { Stdio::piped() })
            .stdout(writer.try_clone().unwrap())
            .stderr(writer)
            .spawn()
            .unwrap();
        feed(&mut child, input);
        let mut byte = [0u8; 1];
        let _ = reader.read(&mut byte);
        drop(reader);
        let out = wait_at_most(child, Duration::from_secs(60));
        assert!(out.status.success(), "{args:?} 2>&1 | head -c 1: {:?}", out.status);
    }
    assert!(GgufFile::open(&quantized).is_ok(), "quantize wrote its whole file though nobody read its log");
}

/// Writes `input` to the child's stdin from a thread (a command that stops reading must not block the test).
fn feed(child: &mut Child, input: &[u8]) {
    if let Some(mut stdin) = child.stdin.take() {
        let input = input.to_vec();
        std::thread::spawn(move || {
            let _ = stdin.write_all(&input);
        });
    }
}

/// R8: a context or batch whose KV cache cannot fit is refused before anything is allocated, with the numbers.
#[test]
fn r08_a_context_too_large_for_memory_is_refused_up_front() {
    let dir = tempdir();
    let m = tiny(dir.path());
    let m = m.to_str().unwrap();
    for args in [
        vec!["run", m, "-p", "x", "-c", "100000000000"],
        vec!["chat", m, "-c", "18446744073709551615"],
        vec!["bench", m, "-p", "1000000000000", "-n", "0", "-r", "1"],
        vec!["bench", m, "--batch", "100000000000", "-r", "1"],
    ] {
        let out = infer_bin().args(&args).stdin(Stdio::null()).output().unwrap();
        let err = text(&out.stderr);
        assert!(!out.status.success() && out.status.code() != Some(101), "{args:?}: {err}");
        let last = err.lines().last().unwrap_or_default();
        assert!(last.contains("memory is available") || last.contains("overflows"), "{args:?}: {err}");
    }
    // The check costs nothing when the context fits.
    assert!(infer(&["run", m, "-p", "x", "-n", "1", "-c", "64"]).status.success());
}

/// R9: a truncated model is refused at load with the sizes and a hint to download it again.
#[test]
fn r09_a_truncated_file_is_refused_at_load() {
    let dir = tempdir();
    let m = tiny(dir.path());
    let bytes = std::fs::read(&m).unwrap();
    std::fs::write(&m, &bytes[..bytes.len() - 1000]).unwrap();
    assert_clean_failure(&infer(&["run", m.to_str().unwrap(), "-p", "x"]), "truncated or corrupt, re-download it");
}

/// R10: a mapped model that shrinks on disk while infer runs stops it with one line and status 1, not SIGBUS; one
/// that changed between chat turns is an error for the turn; with --no-mmap neither matters.
#[test]
fn r10_the_model_changes_on_disk_while_mapped() {
    let dir = tempdir();
    let m = tiny(dir.path());
    // Larger embedding rows than the tiny model: each token's row is read from the map as it is generated.
    let big = dir.path().join("big.gguf");
    build(Spec { n_embd: 256, n_vocab: 259, ..Spec::llama(GgmlType::Q8_0) }, 3).write_file(&big).unwrap();
    for (path, no_mmap) in [(&big, false), (&m, true)] {
        let mut args =
            vec!["run", path.to_str().unwrap(), "-p", "x", "-n", "100000000", "--ignore-eos", "-c", "100000"];
        if no_mmap {
            args.push("--no-mmap");
        }
        let mut child = spawn(&args, Stdio::null());
        let mut stdout = child.stdout.take().unwrap();
        let mut some = [0u8; 16];
        stdout.read_exact(&mut some).unwrap();
        std::fs::OpenOptions::new().write(true).open(path).unwrap().set_len(100).unwrap();
        if no_mmap {
            // Still generating from its own copy.
            std::thread::sleep(Duration::from_millis(500));
            assert!(child.try_wait().unwrap().is_none(), "--no-mmap generation stopped");
            interrupt(&child);
            let out = wait_at_most(child, Duration::from_secs(20));
            assert!(out.status.success(), "{}", text(&out.stderr));
        } else {
            std::thread::spawn(move || std::io::copy(&mut stdout, &mut std::io::sink()));
            let out = wait_at_most(child, Duration::from_secs(20));
            assert_eq!(out.status.code(), Some(1), "status {:?}: {}", out.status, text(&out.stderr));
            assert!(text(&out.stderr).contains("shrank or changed on disk while infer was reading it"));
        }
    }
    // Between chat turns: the file is checked before each generation.
    let m2 = tiny(&dir.path().join("chat").tap_mkdir());
    let mut child = spawn(&["chat", m2.to_str().unwrap(), "-n", "3"], Stdio::piped());
    let mut stdin = child.stdin.take().unwrap();
    let mut stdout = BufReader::new(child.stdout.take().unwrap());
    stdin.write_all(b"one\n").unwrap();
    // The reply ends with a blank line (or is one, when the noise model ends it at once): the turn is over.
    let mut line = String::new();
    loop {
        line.clear();
        if stdout.read_line(&mut line).unwrap() == 0 || line == "\n" {
            break;
        }
    }
    let later = std::time::SystemTime::now() + Duration::from_secs(5);
    std::fs::File::options().write(true).open(&m2).unwrap().set_modified(later).unwrap();
    stdin.write_all(b"two\n").unwrap();
    drop(stdin);
    let out = wait_at_most(child, Duration::from_secs(20));
    assert!(text(&out.stderr).contains("the file changed on disk since it was loaded"), "{}", text(&out.stderr));
}

trait Mkdir {
    fn tap_mkdir(self) -> PathBuf;
}

impl Mkdir for PathBuf {
    fn tap_mkdir(self) -> PathBuf {
        std::fs::create_dir_all(&self).unwrap();
        self
    }
}

/// R11: a model whose weights produce NaN logits stops with a clear error, not garbage text.
#[test]
fn r11_nan_logits_are_an_error() {
    let dir = tempdir();
    let path = dir.path().join("nan.gguf");
    let base = GgufFile::from_bytes(build(Spec::llama(GgmlType::Q8_0), 7).to_bytes().unwrap()).unwrap();
    let mut w = infer::gguf::GgufWriter::new();
    w.copy_metadata(base.metadata());
    for t in base.tensors() {
        let mut data = base.tensor_data(t).to_vec();
        if t.name == "blk.1.ffn_down.weight" {
            // Every Q8_0 block's f16 scale becomes NaN (0x7E00).
            for block in data.chunks_mut(34) {
                block[..2].copy_from_slice(&[0x00, 0x7E]);
            }
        }
        w.add_tensor(&t.name, &t.dims, t.ty, data).unwrap();
    }
    w.write_file(&path).unwrap();
    let out = infer(&["run", path.to_str().unwrap(), "-p", "hello", "-n", "5", "--ignore-eos", "-c", "64"]);
    assert_clean_failure(&out, "is not finite (NaN or infinite): the model's output is broken");
    assert!(out.stdout.is_empty(), "no text: {:?}", text(&out.stdout));
}

/// R12: edge sampling values have their documented meaning, and absurd ones are refused by flag name.
#[test]
fn r12_edge_sampling_values() {
    let dir = tempdir();
    let m = tiny(dir.path());
    let m = m.to_str().unwrap();
    let run = |extra: &[&str]| {
        let mut args = vec!["run", m, "-p", "x", "-n", "3", "--ignore-eos", "--json"];
        args.extend(extra);
        infer(&args)
    };
    for ok in [
        &["--temp", "0"][..],
        &["--top-k", "0"],
        &["--top-k", "1000000000"],
        &["--top-p", "1"],
        &["--min-p", "1"],
        &["--min-p", "0"],
        &["--repeat-penalty", "1000"],
        &["--repeat-last-n", "1000000000"],
        &["--temp", "100000"],
        &["--seed", "18446744073709551615"],
    ] {
        let out = run(ok);
        assert!(out.status.success(), "{ok:?}: {}", text(&out.stderr));
        let v: serde_json::Value = serde_json::from_str(text(&out.stdout).trim()).unwrap();
        assert_eq!(v["tokens"].as_array().unwrap().len(), 3, "{ok:?}");
    }
    for (bad, flag) in [
        (&["--temp", "-1"][..], "--temp"),
        (&["--temp", "inf"], "--temp"),
        (&["--temp", "nan"], "--temp"),
        (&["--top-p", "0"], "--top-p"),
        (&["--top-k", "-1"], "--top-k"),
        (&["--min-p", "1.5"], "--min-p"),
        (&["--repeat-penalty", "0"], "--repeat-penalty"),
        (&["--seed", "-1"], "--seed"),
        (&["--seed", "18446744073709551616"], "--seed"),
    ] {
        assert_clean_failure(&run(bad), flag);
    }
}

/// R13: token ids out of range (and ids that are not ids) in `infer logits` are refused by line and value.
#[test]
fn r13_token_ids_out_of_range_in_logits() {
    let dir = tempdir();
    let m = tiny(dir.path());
    let m = m.to_str().unwrap();
    assert_clean_failure(
        &with_stdin(&["logits", m], b"[1, 2]\n[0, 999999]\n"),
        "stdin line 2: token id 999999 is out of range",
    );
    assert_clean_failure(&with_stdin(&["logits", m], b"[-1]\n"), "stdin line 1: expected a JSON array of token ids");
    assert_clean_failure(&with_stdin(&["logits", m], b"[4294967296]\n"), "stdin line 1");
    assert_clean_failure(&with_stdin(&["logits", m], b"{\"a\": 1}\n"), "stdin line 1");
    let out = with_stdin(&["logits", m], b"[]\n\n[1]\n");
    assert!(out.status.success(), "{}", text(&out.stderr));
}

/// R14: a template that fails at chat time is reported for each message and the chat goes on; `run --chat`
/// refuses with the template's error.
#[test]
fn r14_template_render_errors() {
    let dir = tempdir();
    let m = tiny(dir.path());
    let m = m.to_str().unwrap();
    let tmpl = dir.path().join("raise.jinja");
    std::fs::write(&tmpl, "{% if messages|length > 1 %}{{ raise_exception('only one message, please') }}{% endif %}{{ messages[0].content }}").unwrap();
    let t = tmpl.to_str().unwrap();
    assert_clean_failure(
        &infer(&["run", m, "--chat", "--chat-template", t, "--system", "s", "-p", "x"]),
        "raised an exception: only one message, please",
    );
    let out = with_stdin(&["chat", m, "--chat-template", t, "-n", "2"], b"a\nb\n/clear\nc\n");
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(text(&out.stderr).contains("only one message, please"), "{}", text(&out.stderr));
}

/// R15: invalid flag combinations are refused before anything is loaded, naming the flag.
#[test]
fn r15_invalid_flag_combinations() {
    let dir = tempdir();
    let m = tiny(dir.path());
    let m = m.to_str().unwrap();
    let f = dir.path().join("p.txt");
    std::fs::write(&f, "x").unwrap();
    let f = f.to_str().unwrap();
    for (args, needle) in [
        (vec!["run", m, "-p", "x", "-f", f], "--file"),
        (vec!["run", m, "-p", "x", "--system", "s"], "--chat"),
        (vec!["run", m, "-p", "x", "-t", "0"], "thread count"),
        (vec!["run", m, "-p", "x", "-n", "-2"], "-n"),
        (vec!["run", m, "-p", "x", "-c", "-1"], "-1"),
        (vec!["chat", m, "--on-full", "maybe"], "--on-full"),
        (vec!["bench", m, "-r", "0"], "-r"),
        (vec!["bench", m, "--batch", "0"], "0"),
        (vec!["bench", m, "-t", "0"], "0"),
        (vec!["bench", m, "-p", "x"], "x"),
        (vec!["logits", m, "--top-k", "0"], "--top-k"),
        (vec!["run", m, "-p", "x", "--kv-type", "q4"], "--kv-type"),
    ] {
        let out = infer_bin().args(&args).stdin(Stdio::null()).output().unwrap();
        let err = text(&out.stderr);
        // clap's own messages may take a few lines (the usage); there is still one error, and no panic.
        assert!(matches!(out.status.code(), Some(1 | 2)), "{args:?}: {:?} {err}", out.status);
        assert!(err.starts_with("error: ") && err.matches("error:").count() == 1, "{args:?}: {err}");
        assert!(err.contains(needle), "{args:?} should name {needle:?}: {err}");
    }
}

/// The cache folder: read-only, full (a file-size limit stands in for a full disk), and written by two `infer pull`
/// processes at once. (tests/registry.rs checks the same with threads, and a corrupt or interrupted download.)
#[test]
fn the_cache_folder_read_only_full_or_shared() {
    let dir = tempdir();
    let home = dir.path().join("home");
    let models = home.join("models");
    std::fs::create_dir_all(&models).unwrap();
    let bytes = fake_model(3_000_000, 9);
    let entry = local_source(dir.path(), "fake", &bytes);
    std::fs::write(home.join("models.toml"), toml_entry(&entry)).unwrap();
    let pull = |extra: &dyn Fn(&mut Command)| {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_infer"));
        cmd.args(["pull", "fake"]).env("INFER_HOME", &home);
        extra(&mut cmd);
        cmd.output().unwrap()
    };

    // Full: writes past 1 MB fail (EFBIG), as they would with ENOSPC; nothing half-written stays.
    let out = Command::new("sh")
        .args(["-c", "trap '' XFSZ; ulimit -f 2000; exec \"$0\" pull fake", env!("CARGO_BIN_EXE_infer")])
        .env("INFER_HOME", &home)
        .output()
        .unwrap();
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.trim_end().lines().last().unwrap_or_default().starts_with("error: "), "{err}");
    assert_eq!(listing(&models), [".locks"], "no partial file is left");

    // Two processes at once: both succeed, one verified file.
    let children: Vec<Child> = (0..2)
        .map(|_| {
            Command::new(env!("CARGO_BIN_EXE_infer"))
                .args(["pull", "fake"])
                .env("INFER_HOME", &home)
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    for c in children {
        let out = c.wait_with_output().unwrap();
        assert!(out.status.success(), "{}", text(&out.stderr));
    }
    assert_eq!(listing(&models), [".locks", "fake.gguf", "fake.gguf.sha256"]);
    assert_eq!(std::fs::read(models.join("fake.gguf")).unwrap(), bytes);

    // Read-only: a verified model is still used; a new pull fails cleanly naming the path.
    let _guard = ReadOnly::new(&models);
    assert!(pull(&|_| {}).status.success(), "a verified model in a read-only cache");
    let out = pull(&|c| {
        c.arg("--force");
    });
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains(models.to_str().unwrap()), "the error names the folder: {err}");
}

/// Makes a directory read-only until dropped: `chattr +i` when running as root (root ignores permission bits),
/// mode 0555 otherwise.
struct ReadOnly(PathBuf, bool);

impl ReadOnly {
    fn new(dir: &Path) -> ReadOnly {
        let root = Command::new("id").arg("-u").output().is_ok_and(|o| text(&o.stdout).trim() == "0");
        if root {
            let ok = Command::new("chattr").arg("+i").arg(dir).status().is_ok_and(|s| s.success());
            assert!(ok, "chattr +i {} (root needs it to make a directory read-only)", dir.display());
        } else {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o555)).unwrap();
        }
        ReadOnly(dir.to_path_buf(), root)
    }
}

impl Drop for ReadOnly {
    fn drop(&mut self) {
        if self.1 {
            let _ = Command::new("chattr").arg("-i").arg(&self.0).status();
        } else {
            use std::os::unix::fs::PermissionsExt;
            let _ = std::fs::set_permissions(&self.0, std::fs::Permissions::from_mode(0o755));
        }
    }
}
