//! Log-probabilities: `sampling::top_logprobs` against a plain softmax, and the server's `logprobs` in the chat and
//! completions shapes, whole and streamed, against the tokens and text of the same greedy reply.

use serde_json::{Value, json};

use infer::sampling::{logprob, top_logprobs};

use crate::common::tempdir;
use crate::serve::{Server, post, stream, tiny_model};
use crate::synthetic::Rng;

#[test]
fn top_logprobs_are_the_softmax_s_best_in_order() {
    let mut rng = Rng::new(5);
    for n_vocab in [1usize, 2, 7, 300, 5000] {
        let mut logits: Vec<f32> = (0..n_vocab).map(|_| rng.uniform() * 10.0 - 5.0).collect();
        if n_vocab > 7 {
            logits[3] = logits[1]; // a tie
        }
        let total: f64 = logits.iter().map(|&x| f64::from(x).exp()).sum();
        for n in [1usize, 3, 20] {
            let top = top_logprobs(&logits, n);
            assert_eq!(top.len(), n.min(n_vocab));
            for w in top.windows(2) {
                assert!(w[0].1 > w[1].1 || (w[0].1 == w[1].1 && w[0].0 < w[1].0), "{w:?}");
            }
            let mut sorted: Vec<u32> = (0..n_vocab as u32).collect();
            sorted.sort_by(|&a, &b| logits[b as usize].total_cmp(&logits[a as usize]).then(a.cmp(&b)));
            for (i, &(id, lp)) in top.iter().enumerate() {
                assert_eq!(id, sorted[i]);
                assert_eq!(lp, logprob(&logits, id));
                let exact = (f64::from(logits[id as usize]).exp() / total).ln();
                assert!((f64::from(lp) - exact).abs() < 1e-4, "{lp} vs {exact}");
            }
        }
    }
    assert!(top_logprobs(&[], 3).is_empty());
    assert!(top_logprobs(&[1.0], 0).is_empty());
}

/// Checks a chat `logprobs.content` list against the reply: one entry per token, the bytes spell the text, and at
/// temperature 0 each chosen token is the first of its alternatives.
fn check_chat_entries(content: &[Value], text: &str, tokens: u64, top: usize) {
    assert_eq!(content.len() as u64, tokens, "one entry per generated token");
    let mut bytes = Vec::new();
    for e in content {
        let b: Vec<u8> = e["bytes"].as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u8).collect();
        bytes.extend(&b);
        let lp = e["logprob"].as_f64().unwrap();
        assert!(lp <= 0.0);
        let alts = e["top_logprobs"].as_array().unwrap();
        assert_eq!(alts.len(), top);
        if top > 0 {
            assert_eq!(alts[0]["bytes"], e["bytes"], "greedy picks the most likely token");
            assert_eq!(alts[0]["logprob"].as_f64().unwrap(), lp);
            for w in alts.windows(2) {
                assert!(w[0]["logprob"].as_f64() >= w[1]["logprob"].as_f64());
            }
        }
    }
    assert_eq!(String::from_utf8(bytes).unwrap(), text, "the tokens' bytes are the reply");
}

#[test]
fn serve_reports_logprobs_in_both_shapes_whole_and_streamed() {
    let dir = tempdir();
    let server = Server::start(&tiny_model(dir.path()), &["--ctx-size", "256", "--chat-template", "chatml"]);
    let chat = format!("{}/v1/chat/completions", server.base);
    let completions = format!("{}/v1/completions", server.base);
    let messages = json!([{"role": "user", "content": "hello there"}]);

    // Chat, whole.
    let body = json!({"messages": messages, "max_tokens": 12, "temperature": 0, "logprobs": true, "top_logprobs": 3});
    let (status, _, text) = post(&chat, body.to_string().as_bytes());
    assert_eq!(status, 200, "{text}");
    let v: Value = serde_json::from_str(&text).unwrap();
    let reply = v["choices"][0]["message"]["content"].as_str().unwrap();
    let tokens = v["usage"]["completion_tokens"].as_u64().unwrap();
    check_chat_entries(v["choices"][0]["logprobs"]["content"].as_array().unwrap(), reply, tokens, 3);

    // Chat, streamed: the same entries, spread over the chunks.
    let mut streamed_body = body.clone();
    streamed_body["stream"] = json!(true);
    let (mut content, mut streamed_text) = (Vec::new(), String::new());
    for data in stream(&chat, &streamed_body) {
        if data == "[DONE]" {
            break;
        }
        let c: Value = serde_json::from_str(&data).unwrap();
        streamed_text.push_str(c["choices"][0]["delta"]["content"].as_str().unwrap_or(""));
        if let Some(list) = c["choices"][0]["logprobs"]["content"].as_array() {
            content.extend(list.iter().cloned());
        }
    }
    assert_eq!(streamed_text, reply);
    check_chat_entries(&content, reply, tokens, 3);
    assert_eq!(content, v["choices"][0]["logprobs"]["content"].as_array().unwrap().clone());

    // Without logprobs the field stays null.
    let plain = json!({"messages": messages, "max_tokens": 4, "temperature": 0});
    let (_, _, text) = post(&chat, plain.to_string().as_bytes());
    assert_eq!(serde_json::from_str::<Value>(&text).unwrap()["choices"][0]["logprobs"], Value::Null);

    // Completions: the legacy shape, with text offsets in bytes.
    let body = json!({"prompt": "hello there", "max_tokens": 10, "temperature": 0, "logprobs": 2});
    let (status, _, text) = post(&completions, body.to_string().as_bytes());
    assert_eq!(status, 200, "{text}");
    let v: Value = serde_json::from_str(&text).unwrap();
    let lp = &v["choices"][0]["logprobs"];
    let n = v["usage"]["completion_tokens"].as_u64().unwrap() as usize;
    assert_eq!(lp["tokens"].as_array().unwrap().len(), n);
    assert_eq!(lp["token_logprobs"].as_array().unwrap().len(), n);
    assert_eq!(lp["top_logprobs"].as_array().unwrap().len(), n);
    assert!(lp["top_logprobs"].as_array().unwrap().iter().all(|m| m.as_object().unwrap().len() <= 2));
    let offsets: Vec<u64> = lp["text_offset"].as_array().unwrap().iter().map(|x| x.as_u64().unwrap()).collect();
    assert_eq!(offsets.first(), Some(&0));
    assert!(offsets.windows(2).all(|w| w[0] <= w[1]));

    // Bad values, by name.
    for (url, body, param, needle) in [
        (&chat, json!({"messages": messages, "logprobs": true, "top_logprobs": 21}), "top_logprobs", "0..=20"),
        (&chat, json!({"messages": messages, "top_logprobs": 2}), "top_logprobs", "needs `logprobs`: true"),
        (&chat, json!({"messages": messages, "logprobs": 1}), "logprobs", "must be true or false"),
        (&completions, json!({"prompt": "hi", "logprobs": 6}), "logprobs", "0..=5"),
        (&completions, json!({"prompt": "hi", "logprobs": true}), "logprobs", "must be an integer"),
        (&completions, json!({"prompt": "hi", "top_logprobs": 2}), "top_logprobs", "use `logprobs`: N"),
    ] {
        let (status, _, text) = post(url, body.to_string().as_bytes());
        assert_eq!(status, 400, "{body} -> {text}");
        let e: Value = serde_json::from_str(&text).unwrap();
        assert_eq!(e["error"]["param"], param, "{text}");
        assert!(e["error"]["message"].as_str().unwrap().contains(needle), "{body}: {text}");
    }
}
