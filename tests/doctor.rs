//! `infer doctor`: each check on synthetic files that are broken in one known way (and on sound ones), the Hugging
//! Face file comparison, exit statuses, flag errors, and both real models.

use std::path::{Path, PathBuf};

use infer::gguf::{GgufWriter, MetaArray, MetaValue};
use infer::kernels::GgmlType;
use serde_json::{Value, json};

use crate::common::{assert_clean_failure, infer, real_model, tempdir};
use crate::synthetic::{Spec, build};

/// A sound synthetic llama (byte-level vocabulary, `<|im_end|>` ends generation), changed by `edit`.
fn model_with(dir: &Path, name: &str, edit: impl FnOnce(&mut GgufWriter)) -> PathBuf {
    let mut w = build(Spec::llama(GgmlType::Q8_0), 7);
    edit(&mut w);
    let path = dir.join(name);
    w.write_file(&path).unwrap();
    path
}

/// `doctor --json` on `path` with extra flags: the exit status and the report.
fn doctor(path: &Path, extra: &[&str]) -> (Option<i32>, Value) {
    let mut args = vec!["doctor", path.to_str().unwrap(), "--json", "-t", "2"];
    args.extend_from_slice(extra);
    let out = infer(&args);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("panicked"), "{stderr}");
    let report: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!("doctor --json printed no JSON ({e}): {}\n{stderr}", String::from_utf8_lossy(&out.stdout))
    });
    assert_eq!(report["ok"], out.status.success(), "the report's verdict and the exit status agree: {report:#}");
    (out.status.code(), report)
}

/// The check named `name`: its status and the summary with the details.
fn check<'a>(report: &'a Value, name: &str) -> (&'a str, String) {
    let c = report["checks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == name)
        .unwrap_or_else(|| panic!("no check {name:?} in {report:#}"));
    let details: Vec<&str> = c["details"].as_array().into_iter().flatten().filter_map(Value::as_str).collect();
    (c["status"].as_str().unwrap(), format!("{} | {}", c["summary"].as_str().unwrap(), details.join(" | ")))
}

fn set_tokens(w: &mut GgufWriter, tokens: Vec<String>) {
    let types = vec![1i32; tokens.len()];
    w.set("tokenizer.ggml.tokens", MetaValue::Array(MetaArray::String(tokens.into())))
        .set("tokenizer.ggml.token_type", MetaValue::Array(MetaArray::I32(types)));
}

/// Sets `tokenizer.ggml.pre`, or removes it.
fn set_pre(w: &mut GgufWriter, pre: Option<&str>) {
    match pre {
        Some(p) => w.set_str("tokenizer.ggml.pre", p),
        None => w.remove("tokenizer.ggml.pre"),
    };
}

/// The synthetic vocabulary's token texts (three specials, then the 256 byte characters).
fn synthetic_tokens() -> Vec<String> {
    let mut t = vec!["<|endoftext|>".to_string(), "<|im_start|>".to_string(), "<|im_end|>".to_string()];
    t.extend((0..=255u8).map(crate::synthetic::byte_to_unicode));
    t
}

#[test]
fn a_sound_file_passes_and_a_base_model_s_stand_in_template_warns() {
    let dir = tempdir();
    let path = model_with(dir.path(), "ok.gguf", |_| {});
    let (code, report) = doctor(&path, &[]);
    // No chat template in the file: the stand-in is a warning, which passes unless --strict.
    assert_eq!(code, Some(0), "{report:#}");
    for name in ["tokenizer", "special tokens", "round trip", "end of turn", "weights", "context", "forward"] {
        assert_eq!(check(&report, name).0, "ok", "{name}: {report:#}");
    }
    let (status, text) = check(&report, "chat template");
    assert_eq!(status, "warn");
    assert!(text.contains("built-in 'chatml'"), "{text}");
    assert!(check(&report, "end of turn").1.contains("<|im_end|>"), "{report:#}");
    assert!(check(&report, "forward").1.contains("continues"), "{report:#}");
    assert!(report["sample"].as_str().unwrap().ends_with("<|im_start|>assistant\n"), "{report:#}");

    let (code, _) = doctor(&path, &["--strict"]);
    assert_eq!(code, Some(1), "--strict fails on a warning");

    // The file's own template: no warning at all.
    let own = model_with(dir.path(), "own.gguf", |w| {
        w.set_str(
            "tokenizer.chat_template",
            "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}\
             {% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}",
        );
    });
    let (code, report) = doctor(&own, &["--strict", "--no-forward"]);
    assert_eq!(code, Some(0), "{report:#}");
    assert_eq!(check(&report, "forward").0, "skip");

    // The text report: a line per check and the tally.
    let out = infer(&["doctor", own.to_str().unwrap(), "--no-forward"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success());
    assert!(text.contains("ok    end of turn") && text.contains("  | <|im_start|>user"), "{text}");
    assert!(text.trim_end().ends_with("0 failed, 2 skipped"), "{text}");
}

#[test]
fn an_end_of_turn_token_that_does_not_end_generation_fails() {
    let dir = tempdir();
    // Turns end with <|im_start|>, a control token that is not an end-of-generation token.
    let path = model_with(dir.path(), "eot.gguf", |w| {
        w.set_str(
            "tokenizer.chat_template",
            "{% for m in messages %}{{ m.role }}: {{ m.content }}<|im_start|>{% endfor %}\
             {% if add_generation_prompt %}assistant: {% endif %}",
        );
    });
    let (code, report) = doctor(&path, &["--no-forward"]);
    assert_eq!(code, Some(1));
    let (status, text) = check(&report, "end of turn");
    assert_eq!(status, "fail");
    assert!(text.contains("\"<|im_start|>\" (1), which does not end generation"), "{text}");
    assert!(text.contains("--stop \"<|im_start|>\""), "{text}");
    let out = infer(&["doctor", path.to_str().unwrap(), "--no-forward"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(stderr.trim(), "error: 1 check failed");
    assert!(String::from_utf8_lossy(&out.stdout).contains("FAIL  end of turn"));

    // `run --chat` (and `chat`, `serve`) warn at the start, unless a --stop already names the token; the --stop
    // the warning suggests ends generation at that control token.
    let run = |extra: &[&str]| {
        let mut args = vec!["run", path.to_str().unwrap(), "--chat", "-p", "hi", "-n", "3", "--temp", "0", "--json"];
        args.extend_from_slice(extra);
        let out = infer(&args);
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let warning = "ends each turn with \"<|im_start|>\" (token 1), which does not end generation";
    assert!(run(&[]).contains(warning), "{}", run(&[]));
    let stderr = run(&["--stop", "<|im_start|>"]);
    assert!(!stderr.contains(warning), "{stderr}");
    let out = infer(&["chat", path.to_str().unwrap(), "-n", "2"]);
    assert!(String::from_utf8_lossy(&out.stderr).contains(warning));
}

#[test]
fn templates_that_break_refuse_or_ignore_are_reported() {
    let dir = tempdir();
    let cases = [
        // A syntax error: the template does not load.
        ("{% for m in messages %}{{ m.content }", "fail", "does not parse"),
        // Raises whatever it is given: nothing renders.
        ("{{ raise_exception('no conversation suits me') }}", "fail", "does not render a conversation"),
        // Refuses a system message (Gemma 2's style of raising an error).
        (
            "{% for m in messages %}{% if m.role == 'system' %}{{ raise_exception('System role not supported') }}\
             {% endif %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}\
             {% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}",
            "warn",
            "refuses a system message",
        ),
        // Drops the system message and never opens the reply.
        (
            "{% for m in messages %}{% if m.role != 'system' %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n\
             {% endif %}{% endfor %}",
            "warn",
            "drops the system message",
        ),
        // Teaches <tool_call> tags but never writes the tools it is given.
        (
            "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}\
             {% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}\
             {# tools: answer with <tool_call>{\"name\": ..., \"arguments\": ...}</tool_call> #}",
            "warn",
            "teaches <tool_call> tags but does not write the tools it is given",
        ),
        // The tagged style done right (the test template): the tools reach the model.
        (include_str!("data/tagged-tools.jinja"), "ok", "tool calls: as the template's own <tool_call> tags"),
        (include_str!("data/llama3-tools.jinja"), "ok", "tool calls: as the template's own a bare {\"name\""),
    ];
    for (i, (template, status, needle)) in cases.into_iter().enumerate() {
        let path = model_with(dir.path(), &format!("t{i}.gguf"), |w| {
            w.set_str("tokenizer.chat_template", template);
        });
        let (code, report) = doctor(&path, &["--no-forward"]);
        let (got, text) = check(&report, "chat template");
        assert_eq!(got, status, "case {i}: {report:#}");
        assert!(text.contains(needle), "case {i}: {text}");
        assert_eq!(code, Some(if status == "fail" { 1 } else { 0 }), "case {i}");
        if i == 3 {
            assert!(text.contains("ignores add_generation_prompt"), "{text}");
        }
    }
    // --chat-template checks a built-in (or a file) in place of the file's own.
    let path = model_with(dir.path(), "broken.gguf", |w| {
        w.set_str("tokenizer.chat_template", "{% if %}");
    });
    let (code, report) = doctor(&path, &["--no-forward", "--chat-template", "chatml"]);
    assert_eq!(code, Some(0), "{report:#}");
    assert!(check(&report, "chat template").1.contains("'chatml' (given)"), "{report:#}");
}

#[test]
fn a_llama3_vocabulary_without_its_pre_tokenizer_fails() {
    let dir = tempdir();
    // Llama 3's vocabulary is recognised by <|begin_of_text|> and its size; filler stands for the rest.
    let mut tokens = synthetic_tokens();
    tokens.push("<|begin_of_text|>".into());
    tokens.extend((tokens.len()..128_256).map(|i| format!("[filler{i}]")));
    for (pre, status) in [(Some("default"), "fail"), (None, "fail"), (Some("gpt2"), "fail"), (Some("llama-bpe"), "ok")]
    {
        let path = model_with(dir.path(), "l3.gguf", |w| {
            set_tokens(w, tokens.clone());
            set_pre(w, pre);
        });
        let (code, report) = doctor(&path, &["--no-forward"]);
        let (got, text) = check(&report, "tokenizer");
        assert_eq!(got, status, "pre {pre:?}: {text}");
        if status == "fail" {
            assert_eq!(code, Some(1));
            assert!(text.contains("this is Llama 3's vocabulary"), "{text}");
        }
    }
    // An ordinary vocabulary that names no pre-tokenizer, or 'default': a warning.
    for pre in [None, Some("default")] {
        let path = model_with(dir.path(), "old.gguf", |w| set_pre(w, pre));
        let (_, report) = doctor(&path, &["--no-forward"]);
        assert_eq!(check(&report, "tokenizer").0, "warn", "{pre:?}: {report:#}");
    }
    // A pre-tokenizer infer does not know: the tokenizer fails and what needs it is skipped.
    let path = model_with(dir.path(), "unknown.gguf", |w| {
        w.set_str("tokenizer.ggml.pre", "no-such-pre");
    });
    let (code, report) = doctor(&path, &[]);
    assert_eq!(code, Some(1));
    let (status, text) = check(&report, "tokenizer");
    assert_eq!(status, "fail");
    assert!(text.contains("no-such-pre"), "{text}");
    for name in ["round trip", "chat template", "forward"] {
        assert_eq!(check(&report, name).0, "skip", "{name}: {report:#}");
    }
}

#[test]
fn special_token_mistakes_are_reported() {
    let dir = tempdir();
    // EOS pointing at an ordinary token ('.'): generation stops wherever the model writes a full stop.
    let dot = 3 + u32::from(b'.');
    let path = model_with(dir.path(), "eos.gguf", |w| {
        w.set_u32("tokenizer.ggml.eos_token_id", dot);
    });
    let (_, report) = doctor(&path, &["--no-forward"]);
    let (status, text) = check(&report, "special tokens");
    assert_eq!(status, "warn", "{text}");
    assert!(text.contains(&format!("\".\" ({dot}) ends generation but is an ordinary token")), "{text}");

    // Nothing ends generation: no EOS, and no token with an end-of-turn text.
    let path = model_with(dir.path(), "noeos.gguf", |w| {
        let mut t = synthetic_tokens();
        t[0] = "<|a|>".into();
        t[2] = "<|b|>".into();
        set_tokens(w, t);
        w.remove("tokenizer.ggml.eos_token_id");
    });
    let (code, report) = doctor(&path, &["--no-forward"]);
    assert_eq!(code, Some(1));
    let (status, text) = check(&report, "special tokens");
    assert_eq!(status, "fail");
    assert!(text.contains("no token ends generation"), "{text}");
}

#[test]
fn hugging_face_files_beside_the_model_are_compared() {
    let dir = tempdir();
    let path = model_with(dir.path(), "m.gguf", |_| {});
    let vocab: serde_json::Map<String, Value> =
        synthetic_tokens().into_iter().enumerate().skip(3).map(|(i, t)| (t, json!(i))).collect();
    let added: Vec<Value> = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
        .iter()
        .enumerate()
        .map(|(i, t)| json!({"id": i, "content": t, "special": true}))
        .collect();
    let tokenizer = json!({"model": {"type": "BPE", "vocab": vocab, "merges": []}, "added_tokens": added});
    std::fs::write(dir.path().join("tokenizer.json"), tokenizer.to_string()).unwrap();
    std::fs::write(
        dir.path().join("tokenizer_config.json"),
        json!({"eos_token": "<|im_end|>", "bos_token": {"content": "<|im_start|>"}}).to_string(),
    )
    .unwrap();
    let (code, report) = doctor(&path, &["--no-forward"]);
    assert_eq!(code, Some(0), "{report:#}");
    let (status, text) = check(&report, "tokenizer.json");
    assert_eq!(status, "ok", "{text}");
    assert!(text.contains("the same text at every id; the same 0 merges"), "{text}");
    assert_eq!(check(&report, "tokenizer_config.json").0, "ok", "{report:#}");

    // A token that differs, an extra merge, and a config whose EOS does not end generation here, passed by flag.
    let mut changed = tokenizer.clone();
    changed["model"]["vocab"].as_object_mut().unwrap().insert("zz".into(), json!(40));
    changed["model"]["merges"] = json!([["a", "b"]]);
    let other = dir.path().join("other.json");
    std::fs::write(&other, changed.to_string()).unwrap();
    let config = dir.path().join("config.json");
    std::fs::write(&config, json!({"eos_token": "<|im_start|>", "chat_template": "{{ x }}"}).to_string()).unwrap();
    let (code, report) = doctor(
        &path,
        &["--no-forward", "--tokenizer-json", other.to_str().unwrap(), "--tokenizer-config", config.to_str().unwrap()],
    );
    assert_eq!(code, Some(1));
    let (status, text) = check(&report, "tokenizer.json");
    assert_eq!(status, "fail");
    assert!(text.contains("id 40: \"%\" here, \"zz\" there"), "{text}");
    assert!(text.contains("0 merges here, 1 there"), "{text}");
    let (status, text) = check(&report, "tokenizer_config.json");
    assert_eq!(status, "warn");
    assert!(text.contains("does not end generation here"), "{text}");
    assert!(text.contains("the conversion dropped it"), "{text}");

    // Files that are not JSON, or not a tokenizer, fail that check by name.
    std::fs::write(&other, "{not json").unwrap();
    let (_, report) = doctor(&path, &["--no-forward", "--tokenizer-json", other.to_str().unwrap()]);
    let (status, text) = check(&report, "tokenizer.json");
    assert_eq!(status, "fail");
    assert!(text.contains("is not valid JSON"), "{text}");
    std::fs::write(&other, "[1, 2]").unwrap();
    let (_, report) = doctor(&path, &["--no-forward", "--tokenizer-json", other.to_str().unwrap()]);
    assert!(check(&report, "tokenizer.json").1.contains("has no model.vocab"), "{report:#}");
}

#[test]
fn bad_arguments_are_one_line_errors() {
    let dir = tempdir();
    let path = model_with(dir.path(), "m.gguf", |_| {});
    let p = path.to_str().unwrap();
    assert_clean_failure(&infer(&["doctor", p, "--tokenizer-json", "/nonexistent/tokenizer.json"]), "--tokenizer-json");
    assert_clean_failure(&infer(&["doctor", p, "--chat-template", "/nonexistent.jinja"]), "no such chat template file");
    assert_clean_failure(&infer(&["doctor", "/nonexistent/model.gguf"]), "/nonexistent/model.gguf");
    let junk = dir.path().join("junk.gguf");
    std::fs::write(&junk, b"not a gguf file at all").unwrap();
    assert_clean_failure(&infer(&["doctor", junk.to_str().unwrap()]), "junk.gguf");
}

#[test]
fn the_real_models_pass() {
    for (name, template) in [("smollm2", "ok"), ("gemma3", "warn")] {
        let Some(path) = real_model(name) else { return };
        let (code, report) = doctor(&path, &[]);
        assert_eq!(code, Some(0), "{name}: {report:#}");
        for c in report["checks"].as_array().unwrap() {
            let want = match c["name"].as_str().unwrap() {
                "chat template" => template,
                "tokenizer.json" => "skip",
                _ => "ok",
            };
            assert_eq!(c["status"], want, "{name}: {c:#}");
        }
        // Both read all fourteen texts back, and say the capital of France (SmolLM2) or speak of it (Gemma 3 270M,
        // a base model).
        assert!(check(&report, "round trip").1.contains("14 of them back unchanged"), "{report:#}");
        assert!(check(&report, "forward").1.contains("France") || check(&report, "forward").1.contains("Paris"));
    }
}

#[test]
fn every_family_fixture_loads_runs_and_tokenizes_its_sentencepiece_vocabulary() {
    let dir = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data/families");
    for family in ["qwen2", "qwen3", "llama", "phi3", "gemma2", "qwen3moe"] {
        let (code, report) = doctor(&dir.join(format!("{family}.gguf")), &[]);
        assert_eq!(code, Some(0), "{family}: {report:#}");
        let (status, text) = check(&report, "tokenizer");
        assert_eq!(status, "ok", "{family}: {text}");
        assert!(text.contains("SentencePiece (`llama`), 512 tokens, 256 of 256 byte tokens"), "{family}: {text}");
        for name in ["round trip", "weights", "forward"] {
            assert_eq!(check(&report, name).0, "ok", "{family} {name}: {report:#}");
        }
        // No template of their own, and their vocabulary has no end-of-turn token: the stand-in template's marker
        // is plain text, which the report says (a chat with these would run past the end of a turn).
        let (status, text) = check(&report, "end of turn");
        assert_eq!(status, "warn", "{family}: {text}");
        assert!(text.contains("plain text") && text.contains("--stop"), "{family}: {text}");
    }
}
