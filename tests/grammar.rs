//! GBNF grammars (`--grammar`, `--grammar-file`, the server's `grammar` field): the token mask against a
//! token-by-token check on synthetic and real vocabularies, generation through the session, the engine, the CLI and
//! the server, with judges that do not use the grammar machine (serde_json for a JSON grammar, a regular expression
//! for the other).

use std::sync::Arc;

use fancy_regex::Regex;

use infer::engine::{OutputFormat, Request, Scheduler};
use infer::kernels::GgmlType;
use infer::model::KvDtype;
use infer::session::{FinishReason, Session};
use infer::structured::vocab::allows;
use infer::structured::{Grammar, GrammarConstraint, GrammarMachine, SortedVocab};
use infer::tokenizer::Tokenizer;

use crate::common::{infer, real_model};
use crate::engine::load;
use crate::structured::{hot_request, hot_sampling, is_json_prefix, parses_as_object};
use crate::synthetic::Spec;

/// JSON, written as a grammar (whitespace limited so that a value must end).
const JSON: &str = r#"
# One JSON object.
root   ::= object
value  ::= object | array | string | number | ("true" | "false" | "null") ws
object ::= "{" ws ( string ":" ws value ("," ws string ":" ws value)* )? "}" ws
array  ::= "[" ws ( value ("," ws value)* )? "]" ws
string ::= "\"" ( [^"\\\x7F\x00-\x1F] | "\\" (["\\/bfnrt] | "u" [0-9a-fA-F]{4}) )* "\"" ws
number ::= "-"? ("0" | [1-9] [0-9]{0,15}) ("." [0-9]+)? ([eE] [-+]? [0-9]{1,3})? ws
ws     ::= | " " | "\n" [ \t]{0,8}
"#;

/// A regular language that must end within a few dozen characters, and a regular expression for its texts.
const TAGS: &str = r#"root ::= tag ("," tag){0,3} "!"
tag ::= "<" [a-cé]{1,3} ">""#;
const TAGS_WHOLE: &str = r"^<[a-cé]{1,3}>(,<[a-cé]{1,3}>){0,3}!$";

fn grammar(text: &str) -> Arc<Grammar> {
    Arc::new(Grammar::parse(text).unwrap_or_else(|e| panic!("{e}")))
}

/// Masks at every byte of some texts of the grammar against feeding each token's bytes to the machine, and the
/// constraint's end-of-generation bits where the text is whole.
fn check_masks(tok: &Tokenizer, g: &str, texts: &[&str]) {
    let g = grammar(g);
    let vocab = Arc::new(SortedVocab::new(tok));
    let mut walker = GrammarMachine::new(g.clone());
    let mut judge = GrammarMachine::new(g.clone());
    let (mut mask, mut scratch) = (Vec::new(), Vec::new());
    let mut checked = 0;
    for text in texts {
        let mut prefix = Vec::new();
        for &b in text.as_bytes().iter().chain([&0u8]) {
            let start = walker.start();
            let state = walker.feed(start, &prefix).unwrap_or_else(|| panic!("{text:?} refused"));
            let cell = std::cell::RefCell::new(&mut walker);
            let step = |s: &mut u32, b: u8| cell.borrow_mut().step(*s, b).map(|n| *s = n).is_some();
            vocab.fill_mask(&state, None, step, &mut mask, &mut scratch);
            let judge_start = judge.feed(judge.start(), &prefix).unwrap();
            for id in 0..tok.n_vocab() as u32 {
                let bytes = tok.token_bytes(id, true);
                let expected = !bytes.is_empty() && !tok.is_eog(id) && judge.feed(judge_start, bytes).is_some();
                assert_eq!(
                    allows(&mask, id),
                    expected,
                    "token {id} {:?} after {prefix:?}",
                    String::from_utf8_lossy(bytes)
                );
            }
            checked += 1;
            prefix.push(b);
            if prefix.len() > text.len() {
                break;
            }
        }
    }
    assert!(checked > texts.len());

    // Through the constraint, token by token: the end-of-generation tokens are allowed exactly where the text is a
    // whole match, and taking one completes it.
    let eog: Vec<u32> = (0..tok.n_vocab() as u32).filter(|&id| tok.is_eog(id)).collect();
    assert!(!eog.is_empty());
    for text in texts {
        let mut c = GrammarConstraint::new(vocab.clone(), g.clone());
        let mut judge = GrammarMachine::new(g.clone());
        let mut state = judge.start();
        for id in tok.encode(text, false, false) {
            assert!(allows(c.mask(), id), "{text:?}: token {id} not allowed");
            c.accept(id, tok.token_bytes(id, true)).unwrap();
            state = judge.feed(state, tok.token_bytes(id, true)).unwrap();
            for &e in &eog {
                assert_eq!(allows(c.mask(), e), judge.is_accepting(state), "{text:?}");
            }
        }
        assert!(judge.is_accepting(state), "{text:?} is a whole match");
        // Complete already where nothing can follow; else once an end-of-generation token is taken.
        assert_eq!(c.is_complete(), !judge.is_open(state), "{text:?}");
        c.accept(eog[0], tok.token_bytes(eog[0], true)).unwrap();
        assert!(c.is_complete());
        assert!(c.accept(eog[0], tok.token_bytes(eog[0], true)).is_err(), "nothing after the end");
    }
}

const JSON_TEXTS: [&str; 2] = [
    "{\"name\": \"Ada \\u00e9 é 😀\", \"n\": [1, -2.5e+3, true, null], \"o\": {}}",
    "{\n  \"a\": [\n    [],\n  {}]}\n",
];
const TAG_TEXTS: [&str; 2] = ["<abc>,<é>,<a>,<bé>!", "<cab>!"];

#[test]
fn the_mask_matches_a_token_by_token_check_on_a_synthetic_vocabulary() {
    let (_, tok) = load(Spec::llama(GgmlType::Q8_0));
    check_masks(&tok, JSON, &["{\"a\": [1, true]}"]);
    check_masks(&tok, TAGS, &["<ab>,<c>!"]);
}

#[test]
fn the_mask_matches_a_token_by_token_check_on_smollm2_and_gemma3() {
    for name in ["smollm2", "gemma3"] {
        let Some(path) = real_model(name) else { return };
        let file = infer::gguf::GgufFile::open(&path).unwrap();
        let tok = Tokenizer::from_gguf(&file).unwrap();
        check_masks(&tok, JSON, &JSON_TEXTS);
        check_masks(&tok, TAGS, &TAG_TEXTS);
    }
}

/// Generates with the session at a high temperature on a random model: every text is a prefix of the language, and
/// every one that ended on its own is a whole text of it.
#[test]
fn session_output_follows_the_grammar_on_a_random_model() {
    let (model, tok) = load(Spec::llama(GgmlType::Q8_0));
    let mut session = Session::new(&model, &tok, 512, KvDtype::F16);
    let cancel = std::sync::atomic::AtomicBool::new(false);
    let tags = Regex::new(TAGS_WHOLE).unwrap();
    let mut closed = 0;
    for seed in 0..24 {
        let (g, json) = if seed % 2 == 0 { (JSON, true) } else { (TAGS, false) };
        let req = hot_request(OutputFormat::Grammar(grammar(g)), seed, 120);
        let out = session.generate(&req, &cancel, &mut |_| Ok(())).unwrap();
        assert_eq!(out.text.as_bytes(), tok.decode_bytes(&out.tokens, true));
        let done = out.finish == FinishReason::Stop;
        if json {
            assert!(if done { parses_as_object(&out.text) } else { is_json_prefix(&out.text) }, "{:?}", out.text);
            closed += usize::from(done);
        } else {
            // The tag lists are short enough that every one must end.
            assert!(done && tags.is_match(&out.text).unwrap(), "seed {seed} ({:?}): {:?}", out.finish, out.text);
        }
    }
    assert!(closed >= 3, "only {closed} of 12 JSON objects closed within 120 tokens");
}

#[test]
fn engine_requests_with_grammars_share_a_batch_with_free_text() {
    let (model, tok) = load(Spec::llama(GgmlType::Q8_0));
    let mut sched = Scheduler::new(&model, &tok, crate::engine::config()).unwrap();
    let tags = grammar(TAGS);
    let reqs: Vec<Request> = (0..8u64)
        .map(|i| Request {
            prompt: vec![1, 50 + i as u32, 60, 70],
            max_tokens: 100,
            sampling: hot_sampling(i),
            stop: Vec::new(),
            ignore_eos: false,
            logprobs: false,
            top_logprobs: 0,
            format: if i % 2 == 0 { OutputFormat::Grammar(tags.clone()) } else { OutputFormat::Text },
            logit_bias: Default::default(),
            dry_breakers: None,
        })
        .collect();
    let streams: Vec<_> = reqs.iter().map(|r| sched.submit(r.clone()).unwrap()).collect();
    while !sched.is_idle() {
        sched.step();
        sched.audit().unwrap();
    }
    let tags = Regex::new(TAGS_WHOLE).unwrap();
    for (i, s) in streams.into_iter().enumerate() {
        let c = s.collect().unwrap();
        if i % 2 == 0 {
            assert_eq!(c.done.as_ref().unwrap().finish, FinishReason::Stop, "{:?}", c.text);
            assert!(tags.is_match(&c.text).unwrap(), "{:?}", c.text);
        }
    }
}

#[test]
fn run_grammar_on_smollm2() {
    let Some(path) = real_model("smollm2") else { return };
    let path = path.to_str().unwrap();
    // A question the model answers the same way greedily, held to two words.
    let out = infer(&[
        "run",
        path,
        "--chat",
        "-p",
        "Is Paris the capital of France? Answer yes or no.",
        "--grammar",
        r##"root ::= ("yes" | "no") ".""##,
        "--temp",
        "0",
        "-n",
        "20",
    ]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(String::from_utf8_lossy(&out.stdout), "yes.");

    // From a file, sampled: every reply is a list of three lines.
    let dir = crate::common::tempdir();
    let file = dir.path().join("list.gbnf");
    std::fs::write(&file, "# three fruits\nroot ::= item{3}\nitem ::= \"- \" [A-Za-z ]{1,30} \"\\n\"\n").unwrap();
    let three = Regex::new(r"^(- [A-Za-z ]{1,30}\n){3}$").unwrap();
    for seed in ["1", "2", "3"] {
        let out = infer(&[
            "run",
            path,
            "--chat",
            "-p",
            "Name three fruits.",
            "--grammar-file",
            file.to_str().unwrap(),
            "--seed",
            seed,
            "-n",
            "60",
            "--json",
        ]);
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        let text = v["text"].as_str().unwrap();
        assert_eq!(v["finish_reason"], "stop", "{text:?}");
        assert!(three.is_match(text).unwrap(), "seed {seed}: {text:?}");
    }

    // Bad grammars and conflicting flags: a clear message and exit code 2, before the model loads.
    for (args, needle) in [
        (vec!["--grammar", "root ::= fruit"], "line 1, column 10: rule `fruit` is used but not defined"),
        (vec!["--grammar", "root ::= \"a"], "a string literal is not closed"),
        (vec!["--grammar-file", "/nonexistent/g.gbnf"], "/nonexistent/g.gbnf"),
        (vec!["--grammar", "root ::= \"a\"", "--format", "json"], "cannot be used with"),
        (vec!["--grammar", "root ::= \"a\"", "--json-schema", "{}"], "cannot be used with"),
    ] {
        let mut all = vec!["run", path, "-p", "hi"];
        all.extend(args);
        let out = infer(&all);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{all:?}: {err}");
        assert!(err.contains(needle), "{all:?}: {err}");
    }
}

#[test]
fn serve_takes_a_grammar_field() {
    use crate::serve::{Server, post, tiny_model};
    let dir = crate::common::tempdir();
    let server = Server::start(&tiny_model(dir.path()), &["--ctx-size", "256", "--chat-template", "chatml"]);
    let tags = Regex::new(TAGS_WHOLE).unwrap();
    for seed in 0..6 {
        let body = serde_json::json!({
            "messages": [{"role": "user", "content": "tags"}], "grammar": TAGS,
            "max_tokens": 100, "temperature": 1.5, "top_k": 0, "top_p": 1.0, "min_p": 0.0, "seed": seed,
        });
        let (status, _, text) = post(&format!("{}/v1/chat/completions", server.base), body.to_string().as_bytes());
        assert_eq!(status, 200, "{text}");
        let v: serde_json::Value = serde_json::from_str(&text).unwrap();
        let content = v["choices"][0]["message"]["content"].as_str().unwrap();
        assert_eq!(v["choices"][0]["finish_reason"], "stop", "{content:?}");
        assert!(tags.is_match(content).unwrap(), "{content:?}");
    }
    for (extra, needle) in [
        (r#""grammar": "root ::= x""#, "`grammar`: line 1, column 10: rule `x` is used but not defined"),
        (r#""grammar": 5"#, "`grammar` must be GBNF text, not a number"),
        (r#""grammar": "root ::= \"a\"", "response_format": {"type": "json_object"}"#, "not both"),
    ] {
        let body = format!(r#"{{"prompt": "hi", {extra}}}"#);
        let (status, _, text) = post(&format!("{}/v1/completions", server.base), body.as_bytes());
        assert_eq!(status, 400, "{body} -> {text}");
        let v: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(v["error"]["param"], "grammar", "{text}");
        assert!(v["error"]["message"].as_str().unwrap().contains(needle), "{body}: {text}");
    }
    // An empty grammar is none, as in llama-server.
    let (status, _, text) =
        post(&format!("{}/v1/completions", server.base), br#"{"prompt": "hi", "grammar": "", "max_tokens": 3}"#);
    assert_eq!(status, 200, "{text}");
}

#[test]
fn chat_settings_save_and_load_a_grammar() {
    use infer::chat::ChatSettings;
    let settings = ChatSettings { format: OutputFormat::Grammar(grammar(TAGS)), ..ChatSettings::default() };
    let text = serde_json::to_string(&settings).unwrap();
    let back: ChatSettings = serde_json::from_str(&text).unwrap();
    assert_eq!(back, settings);
    assert_eq!(back.format.name(), "grammar");
    // A saved grammar that no longer compiles is refused on load, with the reason.
    let bad = text.replace("root ::=", "start ::=");
    let e = serde_json::from_str::<ChatSettings>(&bad).unwrap_err().to_string();
    assert!(e.contains("no rule `root`"), "{e}");
}

/// A grammar that can only go on with a digit, every token beginning with one banned: the request fails with the
/// grammar's account of its dead end (the bytes it would take), in the engine and in a session alike.
#[test]
fn a_dead_end_names_the_bytes_the_grammar_wanted() {
    let (model, tok) = load(Spec::llama(GgmlType::Q8_0));
    let digits: Vec<(u32, f32)> = (0..model.config.n_vocab as u32)
        .filter(|&id| tok.token_bytes(id, true).first().is_some_and(u8::is_ascii_digit))
        .map(|id| (id, f32::NEG_INFINITY))
        .collect();
    assert!(digits.len() >= 10);
    let bias = infer::sampling::LogitBias::new(digits).unwrap();
    let mut req = hot_request(OutputFormat::Grammar(grammar(r#"root ::= "x" [0-9]"#)), 3, 10);
    req.logit_bias = bias.clone();
    let mut session = Session::new(&model, &tok, 512, KvDtype::F16);
    let cancel = std::sync::atomic::AtomicBool::new(false);
    let e = session.generate(&req, &cancel, &mut |_| Ok(())).unwrap_err().to_string();
    assert!(e.contains("the grammar can only go on with [0-9], and no token"), "{e}");

    let mut sched = Scheduler::new(&model, &tok, crate::engine::config()).unwrap();
    let engine_req = Request {
        format: OutputFormat::Grammar(grammar(r#"root ::= "x" [0-9]"#)),
        logit_bias: bias,
        sampling: hot_sampling(3),
        ..crate::engine::greedy(vec![1, 50, 60], 10)
    };
    let stream = sched.submit(engine_req).unwrap();
    while !sched.is_idle() {
        sched.step();
    }
    let e = stream.collect().unwrap_err();
    assert!(e.contains("the grammar can only go on with [0-9], and no token"), "{e}");
}
