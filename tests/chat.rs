//! `infer chat`: piped conversations through the binary (SmolLM2), the context policy, commands and their mistakes,
//! Gemma 3's sliding window through the library, and a real terminal under tmux.

use std::io::Write;
use std::process::{Output, Stdio};
use std::sync::atomic::AtomicBool;

use infer::chat::{Chat, ChatSettings};
use infer::gguf::GgufFile;
use infer::kernels::GgmlType;
use infer::model::{KvDtype, Model};
use infer::sampling::SamplingParams;
use infer::session::{GenerateRequest, Session};
use infer::tokenizer::Tokenizer;
use infer::tokenizer::chat::{ChatMessage, ChatTemplate};

use crate::common::{infer_bin, real_model, tempdir};
use crate::synthetic::{Spec, build};

/// Runs `infer chat ARGS` with `input` on a piped stdin.
fn chat(args: &[&str], input: &str) -> Output {
    let mut child = infer_bin()
        .arg("chat")
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn infer chat");
    child.stdin.take().unwrap().write_all(input.as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "infer chat failed: {stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    out
}

fn stdout(out: &Output) -> String {
    String::from_utf8(out.stdout.clone()).expect("stdout is UTF-8")
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// The JSON objects of a `--json` run, one per reply.
fn json_replies(out: &Output) -> Vec<serde_json::Value> {
    stdout(out).lines().map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}"))).collect()
}

/// Greedy, short, small context, two threads: quick and reproducible.
const QUICK: [&str; 8] = ["--temp", "0", "-n", "48", "-c", "512", "-t", "2"];

fn smollm2() -> Option<String> {
    real_model("smollm2").map(|p| p.to_str().unwrap().to_string())
}

#[test]
fn piped_chat_answers_clears_and_exits_zero() {
    let Some(m) = smollm2() else { return };
    // The issue's command, as written (plus a small context and two threads).
    let input = "What is the capital of France?\n/clear\nWhat is 2+2?\n/exit\nnever read\n";
    let out = chat(&[&m, "--temp", "0", "-c", "512", "-t", "2"], input);
    let text = stdout(&out);
    let replies: Vec<&str> = text.split_terminator("\n\n").collect();
    assert_eq!(replies.len(), 2, "two replies, each followed by a blank line: {text:?}");
    assert!(replies[0].contains("Paris"), "{text:?}");
    // After /clear the second question is answered as the first of a new conversation: the same as alone.
    let alone = stdout(&chat(&[&m, "--temp", "0", "-c", "512", "-t", "2"], "What is 2+2?\n"));
    assert_eq!(format!("{}\n\n", replies[1]), alone);
    assert!(alone.contains('4'), "{alone:?}");
}

#[test]
fn the_second_turn_prefills_only_its_new_tokens() {
    let Some(m) = smollm2() else { return };
    let (q1, q2) = ("What is the capital of France?", "And of Germany?");
    let out = chat(&[&m, "--json"].iter().chain(&QUICK).copied().collect::<Vec<_>>(), &format!("{q1}\n{q2}\n"));
    let r = json_replies(&out);
    assert_eq!(r.len(), 2);
    assert_eq!(r[0]["finish_reason"], "stop", "the first reply ends with the end-of-turn token");
    assert_eq!(r[0]["timings"]["prompt_tokens"], r[0]["prompt_tokens"], "the first turn prefills everything");

    // Count the new tokens independently: the template's text for the second turn past the first exchange.
    let file = GgufFile::open(&m).unwrap();
    let template = ChatTemplate::from_gguf(&file, None).unwrap();
    let tokenizer = Tokenizer::from_gguf(&file).unwrap();
    let a1 = r[0]["text"].as_str().unwrap();
    let before = template.render(&[ChatMessage::new("user", q1), ChatMessage::new("assistant", a1)], false).unwrap();
    let after = template
        .render(&[ChatMessage::new("user", q1), ChatMessage::new("assistant", a1), ChatMessage::new("user", q2)], true)
        .unwrap();
    let delta = after.strip_prefix(before.strip_suffix("<|im_end|>\n").unwrap()).unwrap();
    let new_tokens = tokenizer.encode(delta, false, true).len();
    assert!(new_tokens > 5 && new_tokens < 30, "{delta:?}");
    assert_eq!(r[1]["timings"]["prompt_tokens"], new_tokens, "only {delta:?} is prefilled");
    assert_eq!(r[1]["prompt_tokens"].as_u64().unwrap() as usize, tokenizer.encode_prompt(&after).len());
}

#[test]
fn undo_and_regen_give_the_same_reply_and_rewind_the_cache() {
    let Some(m) = smollm2() else { return };
    let input = "What is the capital of France?\nAnd of Germany?\n/undo\nAnd of Germany?\n/regen\n";
    let r = json_replies(&chat(&[&m, "--json"].iter().chain(&QUICK).copied().collect::<Vec<_>>(), input));
    assert_eq!(r.len(), 4);
    for again in &r[2..] {
        assert_eq!(again["tokens"], r[1]["tokens"], "at --temp 0 the same question gets the same reply");
        assert_eq!(again["prompt_tokens"], r[1]["prompt_tokens"]);
        // The cache goes back to just before the reply: only the last prompt token runs again, for its logits.
        assert_eq!(again["timings"]["prompt_tokens"], 1);
    }
}

#[test]
fn a_saved_conversation_loads_and_goes_on_as_if_never_left() {
    let Some(m) = smollm2() else { return };
    let dir = tempdir();
    let file = dir.path().join("conversation.json");
    let f = file.to_str().unwrap();
    let args: Vec<&str> = [&m as &str, "--json", "--system", "Answer briefly."].iter().chain(&QUICK).copied().collect();
    let (q1, q2, q3) = ("What is the capital of France?", "And of Germany?", "And of Italy?");
    let straight = json_replies(&chat(&args, &format!("{q1}\n{q2}\n/save {f}\n{q3}\n")));
    let saved: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&file).unwrap()).unwrap();
    let roles: Vec<&str> = saved["messages"].as_array().unwrap().iter().map(|m| m["role"].as_str().unwrap()).collect();
    assert_eq!(roles, ["system", "user", "assistant", "user", "assistant"]);
    assert_eq!(saved["messages"][0]["content"], "Answer briefly.");
    assert_eq!(saved["settings"]["temperature"], 0.0);
    assert_eq!(saved["settings"]["max_tokens"], 48);

    // A new process with other settings: /load brings back the conversation and its settings.
    let other = [&m as &str, "--json", "--temp", "1.5", "-c", "512", "-t", "2"];
    let resumed = json_replies(&chat(&other, &format!("/load {f}\n{q3}\n")));
    assert_eq!(resumed.len(), 1);
    assert_eq!(resumed[0]["text"], straight[2]["text"]);
    assert_eq!(resumed[0]["tokens"], straight[2]["tokens"]);
}

/// One line of stderr per mistake, each starting with `error:`, and nothing else on stderr.
fn error_lines(out: &Output) -> Vec<String> {
    let err = stderr(out);
    let lines: Vec<String> = err.lines().map(str::to_string).collect();
    assert!(lines.iter().all(|l| l.starts_with("error: ")), "{err}");
    lines
}

#[test]
fn bad_commands_and_values_are_one_line_errors_and_the_repl_goes_on() {
    let dir = tempdir();
    let model = dir.path().join("tiny.gguf");
    build(Spec::llama(GgmlType::Q8_0), 5).write_file(&model).unwrap();
    let bad_json = dir.path().join("bad.json");
    std::fs::write(&bad_json, r#"{"messages": [{"role": "user", "content": "hi"}]}"#).unwrap();
    let input = format!(
        "/frobnicate\n/set temp hot\n/set top-p 1.5\n/set colour red\n/save\n/undo\n/regen\n/load {}\n/load {}\n\
         /set temp 0\nhello\n/context\n/stats\n",
        dir.path().join("missing.json").display(),
        bad_json.display()
    );
    // The synthetic model has no template of its own: name one, so the note about that is not on stderr either.
    let out = chat(&[model.to_str().unwrap(), "-n", "3", "-c", "128", "--chat-template", "chatml"], &input);
    let errors = error_lines(&out);
    let expected = [
        "unknown command /frobnicate",
        "/set temp: 'hot' is not a number",
        "/set top-p: top-p must be in (0, 1]",
        "unknown setting 'colour'",
        "/save needs a file name",
        "no exchange to undo",
        "no reply to regenerate",
        "missing.json",
        "message 1 (user) has no assistant reply",
    ];
    assert_eq!(errors.len(), expected.len(), "{errors:#?}");
    for (line, needle) in errors.iter().zip(expected) {
        assert!(line.contains(needle), "{line:?} should mention {needle:?}");
    }
    // The REPL went on: a reply (noise from random weights), then /context's line.
    let text = stdout(&out);
    assert!(text.contains("= context 128 tokens"), "{text:?}");
    assert!(text.contains("first token after"), "/stats: {text:?}");
}

#[test]
fn a_small_context_drops_the_oldest_exchanges_and_keeps_the_system_prompt() {
    let Some(m) = smollm2() else { return };
    let dir = tempdir();
    let file = dir.path().join("after.json");
    let questions: Vec<String> = ["France", "Germany", "Italy", "Spain", "Portugal", "Austria", "Poland", "Norway"]
        .iter()
        .map(|c| format!("Please tell me, in one short sentence, which city is the capital of {c}."))
        .collect();
    let system = "You are a geography teacher. Answer in one short sentence.";
    let input = format!("{}\n/context\n/save {}\n", questions.join("\n"), file.display());
    let args = [&m as &str, "--system", system, "--temp", "0", "-n", "24", "-c", "256", "-t", "2"];
    let out = chat(&args, &input);
    let err = stderr(&out);
    // The policy is said on screen, with how many exchanges went.
    let dropped: usize = err
        .lines()
        .filter_map(|l| l.strip_prefix("note: the context is full: dropped the "))
        .map(|l| l.split(' ').next().unwrap().parse::<usize>().unwrap())
        .sum();
    assert!(dropped >= 1, "{err}");
    let saved: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&file).unwrap()).unwrap();
    let messages = saved["messages"].as_array().unwrap();
    assert_eq!(messages[0]["role"], "system");
    assert_eq!(messages[0]["content"], system);
    assert_eq!(messages.len(), 1 + 2 * (questions.len() - dropped), "{saved}");
    assert_eq!(messages.last().unwrap()["role"], "assistant");
    assert_eq!(messages[messages.len() - 2]["content"], *questions.last().unwrap());
    // Every reply was given; /context adds up to the context size.
    let text = stdout(&out);
    let context = text.lines().find(|l| l.contains("= context 256 tokens")).expect("/context's line");
    let parts: Vec<usize> = context.split(' ').filter_map(|w| w.parse().ok()).collect();
    assert_eq!(parts.len(), 5, "{context}");
    assert!(parts[0] > 10, "the system prompt is counted: {context}");
    assert!(parts[..4].iter().sum::<usize>() == 256 && parts[2] <= 24, "{context}");

    // --on-full error: refused with the numbers, and nothing is dropped.
    let out = chat(&[&args[..], &["--on-full", "error"]].concat(), &format!("{}\n", questions.join("\n")));
    let errors = error_lines(&out);
    assert!(!errors.is_empty());
    for e in &errors {
        assert!(e.contains("the context is full") && e.contains("holds 256") && e.contains("reserve 24"), "{e}");
    }

    // A message too long on its own: its token count, and the conversation is left as it was.
    let long = "Tell me about the weather. ".repeat(60);
    let out = chat(&args, &format!("{}\n{long}\n/save {}\n", questions[0], file.display()));
    let errors = error_lines(&out);
    assert_eq!(errors.len(), 1, "{errors:?}");
    assert!(errors[0].contains("the message is") && errors[0].contains("context holds 256"), "{}", errors[0]);
    let saved: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&file).unwrap()).unwrap();
    assert_eq!(saved["messages"].as_array().unwrap().len(), 3, "system and the first exchange stay: {saved}");
}

/// The tokens a fresh session generates greedily for `conversation` followed by `user`.
fn fresh_reply(
    model: &Model,
    tok: &Tokenizer,
    template: &ChatTemplate,
    messages: &[ChatMessage],
    n: usize,
) -> Vec<u32> {
    let prompt = tok.encode_prompt(&template.render(messages, true).unwrap());
    let mut session = Session::new(model, tok, 2048, KvDtype::F16);
    let req = GenerateRequest {
        prompt,
        max_tokens: n,
        sampling: SamplingParams::GREEDY,
        stop: Vec::new(),
        ignore_eos: false,
        format: infer::structured::OutputFormat::Text,
        logit_bias: Default::default(),
        dry_breakers: None,
        draft: infer::speculative::DraftParams::OFF,
    };
    session.generate(&req, &AtomicBool::new(false), &mut |_| Ok(())).unwrap().tokens
}

/// A message of at least `tokens` tokens: a list of numbered items and a question about it.
fn long_message(tok: &Tokenizer, topic: &str, tokens: usize) -> String {
    let mut items = String::new();
    for i in 0.. {
        let text = format!("Here is a list about {topic}:{items}. What was the first item of the list?");
        if tok.encode(&text, false, false).len() >= tokens {
            return text;
        }
        items.push_str(&format!(" item{i}"));
    }
    unreachable!()
}

#[test]
fn gemma3_across_the_sliding_window_matches_a_fresh_session() {
    let Some(path) = real_model("gemma3") else { return };
    let model = Model::load(&path).unwrap();
    let tok = Tokenizer::from_gguf(model.file()).unwrap();
    let window = model.config.sliding_window.expect("Gemma 3 has sliding-window layers");
    let template = || ChatTemplate::from_gguf(model.file(), None).unwrap();
    const N: usize = 6;
    let settings = ChatSettings::from_params(&SamplingParams::GREEDY, Some(0), Some(N));
    let cancel = AtomicBool::new(false);
    // Two turns of 280 tokens pass the window of 512.
    let m1 = long_message(&tok, "rivers", 280);
    let mut m2 = long_message(&tok, "mountains", 280);
    let no_text = &mut |_: &str| Ok(());

    // No margin behind the window: going back re-prefills the conversation, and the pool is as small as it gets,
    // so a 512-token chunk that starts inside a block needs its extra block.
    let session = Session::with_rewind(&model, &tok, 2048, KvDtype::F16, 0);
    let mut chat = Chat::new(session, &tok, template(), None, settings.clone());
    chat.send(&m1, &cancel, no_text).unwrap();
    // Pad the second message so that its prompt of `p` tokens ends where
    // - going back to just before the reply (undo and the same message, or regenerate) needs a freed block: that
    //   needs the window from `p - window` on, and the N - 1 reply tokens that run free the blocks before
    //   `p + N - window`;
    // - the next prompt's first 512-token chunk, from `p + N - 1` on, spans one block more than its positions and
    //   the window fill: its live blocks run from `(p + N - window) / 16` to `(p + N + 511) / 16`.
    let crosses = |p: usize| (p - window) % 16 + N >= 16;
    let straddles = |p: usize| (p + N - window) % 16 >= 2;
    let prompt_len = |chat: &Chat, m2: &str| chat.tokens(&chat.conversation().messages(Some(m2)), true).unwrap().len();
    while !(crosses(prompt_len(&chat, &m2)) && straddles(prompt_len(&chat, &m2))) {
        m2.push_str(" more");
    }
    let r2 = chat.send(&m2, &cancel, no_text).unwrap();
    assert!(r2.prompt_tokens > window, "the conversation ({}) passes the window ({window})", r2.prompt_tokens);
    let conversation = chat.conversation().clone();
    let mut before = conversation.clone();
    before.pop();
    let want = fresh_reply(&model, &tok, &template(), &before.messages(Some(&m2)), N);
    assert_eq!(r2.generation.tokens, want, "turn 2 against a fresh session");

    chat.undo().unwrap();
    let again = chat.send(&m2, &cancel, no_text).unwrap();
    assert_eq!(again.generation.tokens, want, "/undo back across the window, then the same message");
    assert_eq!(again.generation.timings.prompt_tokens, again.prompt_tokens, "the window was gone: all re-prefilled");
    let regen = chat.regenerate(&cancel, no_text).unwrap();
    assert_eq!(regen.generation.tokens, want, "/regen back across the window");
    assert_eq!(regen.generation.timings.prompt_tokens, regen.prompt_tokens, "all re-prefilled");

    // A follow-up of more than one prefill chunk, starting past the window at a position inside a block.
    // (Where it starts, and how many tokens it prefills.)
    let split = |m3: &str| {
        let prompt = chat.tokens(&chat.conversation().messages(Some(m3)), true).unwrap();
        let common = chat.session().cached_tokens().iter().zip(&prompt).take_while(|(a, b)| a == b).count();
        (common, prompt.len() - common)
    };
    let mut m3 = long_message(&tok, "lakes", 500);
    while split(&m3).1 <= 512 {
        m3.push_str(" w");
    }
    let (at, _) = split(&m3);
    assert!(
        at > window && (at + 1 - window) % 16 >= 2,
        "the follow-up starts at {at}, past the window, inside a block"
    );
    let r3 = chat.send(&m3, &cancel, no_text).unwrap();
    assert!(r3.generation.timings.prompt_tokens > 512, "{}", r3.generation.timings.prompt_tokens);
    let want3 = fresh_reply(&model, &tok, &template(), &conversation.messages(Some(&m3)), N);
    assert_eq!(r3.generation.tokens, want3, "a long follow-up at an unaligned position");
    eprintln!(
        "Gemma 3, window {window}: turn 2's prompt {} tokens; /undo and /regen re-prefilled {} and {}; a follow-up \
         of {} tokens from position {at}",
        r2.prompt_tokens,
        again.generation.timings.prompt_tokens,
        regen.generation.timings.prompt_tokens,
        r3.generation.timings.prompt_tokens,
    );

    // With the default margin (one more window), the same rewinds are truncations: one token runs again.
    let session = Session::new(&model, &tok, 2048, KvDtype::F16);
    let mut chat = Chat::new(session, &tok, template(), None, settings);
    chat.send(&m1, &cancel, no_text).unwrap();
    assert_eq!(chat.send(&m2, &cancel, no_text).unwrap().generation.tokens, want);
    chat.undo().unwrap();
    let again = chat.send(&m2, &cancel, no_text).unwrap();
    let regen = chat.regenerate(&cancel, no_text).unwrap();
    for r in [&again, &regen] {
        assert_eq!(r.generation.tokens, want);
        assert_eq!(r.generation.timings.prompt_tokens, 1, "a truncation, not a new prefill");
    }
}

/// The command that leaves (spelled with an escape: tooling has been seen to turn a quoted leading-slash word into
/// a URL).
const EXIT: &str = "\u{2f}exit";

/// A tmux server of our own, on a socket in its own directory; killed (and the directory removed) when dropped.
struct Tmux {
    dir: tempfile::TempDir,
}

impl Tmux {
    /// A server for one test, or `None` (with a note) when tmux is missing; CI, which installs it, fails instead.
    fn start() -> Option<Tmux> {
        let have = std::process::Command::new("tmux").arg("-V").output().is_ok_and(|o| o.status.success());
        if !have {
            crate::common::missing("tmux (the terminal tests need it; .ci/run installs it)");
            return None;
        }
        Some(Tmux { dir: tempdir() })
    }

    fn cmd(&self, args: &[&str]) -> Output {
        let socket = self.dir.path().join("socket");
        std::process::Command::new("tmux").arg("-S").arg(socket).args(args).output().expect("run tmux")
    }

    fn keys(&self, keys: &[&str]) {
        let out = self.cmd(&[&["send-keys", "-t", "t"], keys].concat());
        assert!(out.status.success(), "tmux send-keys: {}", String::from_utf8_lossy(&out.stderr));
    }

    fn screen(&self) -> String {
        String::from_utf8_lossy(&self.cmd(&["capture-pane", "-p", "-J", "-S", "-200", "-t", "t"]).stdout).into_owned()
    }

    /// Waits (up to two minutes) until the screen satisfies `ok`.
    fn wait_for(&self, what: &str, ok: impl Fn(&str) -> bool) -> String {
        let start = std::time::Instant::now();
        loop {
            let screen = self.screen();
            if ok(&screen) {
                return screen;
            }
            assert!(start.elapsed().as_secs() < 120, "timed out waiting for {what}; the screen:\n{screen}");
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
    }
}

impl Drop for Tmux {
    fn drop(&mut self) {
        self.cmd(&["kill-server"]);
    }
}

#[test]
fn in_a_terminal_ctrl_c_stops_a_reply_and_the_history_keeps_both_inputs() {
    let Some(m) = smollm2() else { return };
    let Some(tmux) = Tmux::start() else { return };
    let home = tempdir();
    let command = format!(
        "env INFER_HOME='{}' '{}' chat '{m}' --temp 0 -c 2048 -t 2; echo \"exited with $?\"; sleep 60",
        home.path().display(),
        env!("CARGO_BIN_EXE_infer"),
    );
    let out = tmux.cmd(&["new-session", "-d", "-s", "t", "-x", "100", "-y", "50", &command]);
    assert!(out.status.success(), "tmux new-session: {}", String::from_utf8_lossy(&out.stderr));
    tmux.wait_for("the banner and prompt", |s| s.contains("/help") && s.contains("/2048] >"));

    let story = "Tell me a long story about a dragon.";
    tmux.keys(&[story, "Enter"]);
    // Let the story run for a few lines, then interrupt it.
    tmux.wait_for("the story to stream", |s| s.split(story).nth(1).is_some_and(|r| r.len() > 200));
    tmux.keys(&["C-c"]);
    let screen = tmux.wait_for("the interruption", |s| s.contains("(interrupted: the reply so far is kept)"));
    let told = screen.split(story).nth(1).unwrap().split("(interrupted").next().unwrap().trim().to_string();
    assert!(told.len() > 100, "{screen}");
    // Keys typed before the next prompt is up are echoed by the terminal above it as well as read into it: the
    // question would then appear twice, and the first copy is followed by the prompt line before any answer.
    tmux.wait_for("the next prompt", |s| s.split("(interrupted").nth(1).is_some_and(|r| r.contains("/2048] >")));

    let question = "What is the capital of France? Answer in one word.";
    tmux.keys(&[question, "Enter"]);
    // The text after the question's last copy: the answer, then the prompt after it.
    let screen = tmux.wait_for("the answer", |s| s.rsplit(question).next().is_some_and(|r| r.contains("\n[")));
    let answer = screen.rsplit(question).next().unwrap();
    assert!(answer.contains("Paris"), "{screen}");

    // Colours on a terminal: the prompt is dimmed.
    let coloured = tmux.cmd(&["capture-pane", "-p", "-e", "-t", "t"]).stdout;
    assert!(String::from_utf8_lossy(&coloured).contains("\x1b["), "no colours on a terminal");

    // Ctrl-C at an empty prompt says how to leave; a second one leaves.
    tmux.keys(&["C-c"]);
    tmux.wait_for("how to leave", |s| s.contains("(Ctrl-C again to leave"));
    tmux.keys(&["C-c"]);
    tmux.wait_for("the exit", |s| s.contains("exited with 0"));
    let history = home.path().join("history");
    let text = std::fs::read_to_string(&history).unwrap();
    let entries: Vec<&str> = text.lines().filter(|l| !l.starts_with('#')).collect();
    assert_eq!(entries, [story, question], "{text}");
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&history).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600, "the history is private");
    }
}

#[test]
fn on_a_terminal_run_ends_its_text_with_a_newline_before_the_timing_line() {
    let Some(m) = smollm2() else { return };
    let Some(tmux) = Tmux::start() else { return };
    let command = format!(
        "'{}' run '{m}' -p 'The capital of France is' -n 2 --temp 0 -t 2; echo \"exited with $?\"; sleep 60",
        env!("CARGO_BIN_EXE_infer"),
    );
    let out = tmux.cmd(&["new-session", "-d", "-s", "t", "-x", "200", "-y", "20", &command]);
    assert!(out.status.success(), "tmux new-session: {}", String::from_utf8_lossy(&out.stderr));
    let screen = tmux.wait_for("run to finish", |s| s.contains("exited with"));
    let lines: Vec<&str> = screen.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(lines.len(), 3, "{screen}");
    assert!(lines[0].starts_with(" Paris"), "{screen}");
    assert!(
        lines[1].starts_with("[ load ") && lines[1].ends_with(']'),
        "the timing line on a line of its own: {screen}"
    );
    assert_eq!(lines[2], "exited with 0");
}

#[test]
fn no_color_turns_the_colours_off_on_a_terminal() {
    let Some(m) = smollm2() else { return };
    let Some(tmux) = Tmux::start() else { return };
    let command = format!(
        "env NO_COLOR=1 '{}' chat '{m}' --no-history -c 256 -t 2; echo \"exited with $?\"; sleep 60",
        env!("CARGO_BIN_EXE_infer"),
    );
    assert!(tmux.cmd(&["new-session", "-d", "-s", "t", "-x", "100", "-y", "20", &command]).status.success());
    tmux.wait_for("the banner and prompt", |s| s.contains("/help") && s.contains("/256] >"));
    let screen = tmux.cmd(&["capture-pane", "-p", "-e", "-t", "t"]).stdout;
    assert!(!String::from_utf8_lossy(&screen).contains("\x1b["), "{}", String::from_utf8_lossy(&screen));
    tmux.keys(&[EXIT, "Enter"]);
    tmux.wait_for("the exit", |s| s.contains("exited with 0"));
}

#[test]
fn set_format_json_makes_the_next_replies_json_objects() {
    let Some(m) = smollm2() else { return };
    let q = "Say hello in one short sentence.";
    let args = [&m as &str, "--json", "--temp", "0", "-n", "120", "-c", "1024", "-t", "2"];
    let input = format!("{q}\n/set format json\n{q}\n/set format text\n/clear\n{q}\n");
    let r = json_replies(&chat(&args, &input));
    assert_eq!(r.len(), 3);
    let text = |i: usize| r[i]["text"].as_str().unwrap().to_string();
    let v: serde_json::Value = serde_json::from_str(&text(1)).unwrap_or_else(|e| panic!("{e}: {:?}", text(1)));
    assert!(v.is_object(), "{}", text(1));
    assert_eq!(r[1]["finish_reason"], "stop");
    assert!(serde_json::from_str::<serde_json::Value>(&text(0)).is_err(), "free text: {:?}", text(0));
    assert_eq!(text(2), text(0), "back to free text, the same reply as before");
}

#[test]
fn a_model_without_a_chat_template_gets_a_note_naming_the_built_in_one() {
    let dir = tempdir();
    let model = dir.path().join("tiny.gguf");
    build(Spec::llama(GgmlType::Q8_0), 5).write_file(&model).unwrap();
    let m = model.to_str().unwrap();
    let out = chat(&[m, "-n", "2", "-c", "128"], "hi\n");
    assert!(out.status.success());
    let err = stderr(&out);
    assert!(err.contains("no chat template of its own") && err.contains("built-in 'chatml'"), "{err}");
    let out = chat(&[m, "-n", "2", "-c", "128", "--chat-template", "chatml"], "hi\n");
    assert!(!stderr(&out).contains("no chat template"), "an explicit template needs no note");
}

#[test]
fn set_grammar_and_json_schema_shape_the_next_replies() {
    let Some(m) = smollm2() else { return };
    let args = [&m as &str, "--json", "--temp", "0", "-n", "60", "-c", "1024", "-t", "2"];
    let input = "/set grammar root ::= (\"yes\" | \"no\") \".\"\nIs Paris in France?\n\
                 /set json-schema {\"type\": \"object\", \"properties\": {\"year\": {\"type\": \"integer\"}}, \
                 \"required\": [\"year\"]}\nIn which year did the Second World War end?\n";
    let r = json_replies(&chat(&args, input));
    assert_eq!(r.len(), 2);
    let text = |i: usize| r[i]["text"].as_str().unwrap().to_string();
    assert!(["yes.", "no."].contains(&text(0).as_str()), "{:?}", text(0));
    assert_eq!(r[0]["finish_reason"], "stop");
    let v: serde_json::Value = serde_json::from_str(&text(1)).unwrap_or_else(|e| panic!("{e}: {:?}", text(1)));
    assert!(v["year"].is_i64(), "{v}");
}
