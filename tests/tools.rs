//! Tool calling in `serve` (`tools`, `tool_choice`, `parallel_tool_calls`): replies held to the declared tools on a
//! random synthetic model (every call names an allowed tool and its arguments are an instance of that tool's
//! schema, checked by the validator of `json_schema.rs`; whole and streamed replies agree), the refusals, and on
//! the real models: SmolLM2 through the official `openai` client (a call, then its result sent back), and a
//! conversation holding a call and its result on Gemma 3, whose own template insists on alternating turns.

use serde_json::{Value, json};

use crate::common::{real_model, tempdir};
use crate::json_schema::valid;
use crate::serve::{Server, post, stream, tiny_model};

/// Three tools: plain parameters with an `enum`, none at all, and pydantic's shape (`$defs` and a `$ref` written
/// against the parameters' own root).
fn tools() -> Value {
    json!([
        {"type": "function", "function": {
            "name": "get_weather", "description": "The weather in a city now",
            "parameters": {"type": "object", "properties": {
                "city": {"type": "string", "maxLength": 12},
                "unit": {"enum": ["celsius", "fahrenheit"]},
            }, "required": ["city"]},
        }},
        {"type": "function", "function": {"name": "get_time", "description": "The time now"}},
        {"type": "function", "function": {
            "name": "book",
            "parameters": {
                "$defs": {"Seat": {"type": "object", "properties": {"row": {"type": "integer"},
                                                                    "aisle": {"type": "boolean"}},
                                   "required": ["row", "aisle"]}},
                "type": "object",
                "properties": {"seats": {"type": "array", "items": {"$ref": "#/$defs/Seat"}, "minItems": 1,
                                         "maxItems": 2}},
                "required": ["seats"],
            },
        }},
    ])
}

/// Fails unless `call` (an OpenAI `tool_calls` entry) names one of `allowed` and its arguments are an instance of
/// that tool's parameters.
fn check_call(call: &Value, allowed: &[&str]) {
    assert_eq!(call["type"], "function", "{call}");
    assert!(call["id"].as_str().is_some_and(|id| id.starts_with("call_") && id.len() > 10), "{call}");
    let name = call["function"]["name"].as_str().unwrap();
    assert!(allowed.contains(&name), "{name} is not among {allowed:?}");
    let args: Value = serde_json::from_str(call["function"]["arguments"].as_str().unwrap()).unwrap();
    let tools = tools();
    let tool = tools.as_array().unwrap().iter().find(|t| t["function"]["name"] == name).unwrap();
    let none = json!({"type": "object", "properties": {}, "additionalProperties": false});
    let params = tool["function"].get("parameters").unwrap_or(&none);
    assert!(valid(params, params, &args), "{name}: {args} is not an instance of {params}");
    if name == "get_time" {
        assert_eq!(args, json!({}));
    }
}

/// A whole reply: (content, calls, finish reason).
fn whole(url: &str, body: &Value) -> (Option<String>, Vec<Value>, String) {
    let (status, _, text) = post(url, body.to_string().as_bytes());
    assert_eq!(status, 200, "{text}");
    let v: Value = serde_json::from_str(&text).unwrap();
    let c = &v["choices"][0];
    let calls = c["message"]["tool_calls"].as_array().cloned().unwrap_or_default();
    if !calls.is_empty() {
        assert!(c["message"]["content"].is_null(), "{v}");
    }
    (c["message"]["content"].as_str().map(str::to_string), calls, c["finish_reason"].as_str().unwrap().into())
}

/// A streamed reply, put together as a client does: (content, calls, finish reason), and how many chunks carried
/// parts of calls.
fn streamed(url: &str, body: &Value) -> ((Option<String>, Vec<Value>, String), usize) {
    let mut body = body.clone();
    body["stream"] = json!(true);
    let events = stream(url, &body);
    assert_eq!(events.last().map(String::as_str), Some("[DONE]"));
    let (mut content, mut calls, mut finish) = (None::<String>, Vec::new(), String::new());
    let mut call_chunks = 0;
    for e in &events[..events.len() - 1] {
        let v: Value = serde_json::from_str(e).unwrap();
        let c = &v["choices"][0];
        if let Some(t) = c["delta"]["content"].as_str() {
            content.get_or_insert_with(String::new).push_str(t);
        }
        call_chunks += usize::from(c["delta"]["tool_calls"].is_array());
        // A call's first entry has its id and name; later ones add to its arguments (OpenAI's stream shape).
        for part in c["delta"]["tool_calls"].as_array().into_iter().flatten() {
            let index = part["index"].as_u64().unwrap() as usize;
            let piece = part["function"]["arguments"].as_str().unwrap();
            if index == calls.len() {
                assert!(part["id"].is_string() && part["function"]["name"].is_string(), "{v}");
                let mut call = part.clone();
                call.as_object_mut().unwrap().remove("index");
                calls.push(call);
            } else {
                assert_eq!(index + 1, calls.len(), "{v}");
                assert!(part.get("id").is_none(), "{v}");
                let joined = calls[index]["function"]["arguments"].as_str().unwrap().to_string() + piece;
                calls[index]["function"]["arguments"] = json!(joined);
            }
        }
        if let Some(f) = c["finish_reason"].as_str() {
            finish = f.to_string();
        }
    }
    ((content, calls, finish), call_chunks)
}

/// Calls without their ids (fresh for every reply).
fn without_ids(calls: &[Value]) -> Vec<Value> {
    calls.iter().map(|c| json!({"name": c["function"]["name"], "arguments": c["function"]["arguments"]})).collect()
}

#[test]
fn replies_call_only_declared_tools_with_arguments_of_their_schemas() {
    let dir = tempdir();
    let server = Server::start(&tiny_model(dir.path()), &["--chat-template", "chatml"]);
    let url = format!("{}/v1/chat/completions", server.base);
    let all = ["get_weather", "get_time", "book"];
    let (mut calls_seen, mut words_seen, mut names_seen) = (0, 0, std::collections::BTreeSet::new());
    let mut most_chunks = 0;
    for (choice, parallel, seeds) in [
        (json!("required"), true, 0..6),
        (json!("auto"), true, 0..6),
        (json!({"type": "function", "function": {"name": "book"}}), false, 0..3),
    ] {
        for seed in seeds {
            let body = json!({
                "messages": [{"role": "user", "content": "Book me two seats, and what is the weather?"}],
                "tools": tools(), "tool_choice": choice, "parallel_tool_calls": parallel,
                "max_tokens": 3000, "seed": seed, "temperature": 1.0,
            });
            let (content, calls, finish) = whole(&url, &body);
            eprintln!("{choice} seed {seed}: {finish} {content:?} {}", json!(without_ids(&calls)));
            if finish == "tool_calls" {
                assert!(!calls.is_empty() && content.is_none());
                let allowed: &[&str] = if choice.is_object() { &["book"] } else { &all };
                for call in &calls {
                    check_call(call, allowed);
                    names_seen.insert(call["function"]["name"].as_str().unwrap().to_string());
                }
                assert!(calls.len() <= if parallel { infer::tools::MAX_CALLS } else { 1 }, "{calls:?}");
                // The arguments are the model's own text: a long integer stays an integer.
                assert!(
                    !calls.iter().any(|c| c["function"]["arguments"].as_str().unwrap().contains("e+")),
                    "{calls:?}"
                );
                calls_seen += 1;
            } else {
                // Words are allowed only when the choice is `auto`; cut short by max_tokens they still are words,
                // not the JSON around them.
                assert_eq!(choice, json!("auto"), "{finish} {content:?}");
                assert!(calls.is_empty());
                let text = content.unwrap();
                assert!(!text.starts_with("{\"response\""), "{text:?}");
                words_seen += 1;
            }
            // The same seed streamed: the same words or the same calls (ids aside).
            let ((s_content, s_calls, s_finish), chunks) = streamed(&url, &body);
            most_chunks = most_chunks.max(chunks);
            assert_eq!(s_finish, finish);
            assert_eq!(without_ids(&s_calls), without_ids(&whole(&url, &body).1));
            if finish != "tool_calls" {
                assert_eq!(s_content.unwrap_or_default(), whole(&url, &body).0.unwrap_or_default());
            }
        }
    }
    // The random model takes the road of words under `auto`, and calls more than one tool.
    eprintln!("replies with calls {calls_seen}, with words {words_seen}, tools called {names_seen:?}");
    assert!(calls_seen >= 9 && words_seen >= 1, "calls {calls_seen}, words {words_seen}");
    assert!(names_seen.len() >= 2, "{names_seen:?}");
    // Calls stream as they are written: a name first, then the arguments piece by piece.
    assert!(most_chunks >= 5, "calls came in at most {most_chunks} chunks");
}

#[test]
fn bad_tool_requests_get_400s_naming_the_field() {
    let dir = tempdir();
    let server = Server::start(&tiny_model(dir.path()), &["--chat-template", "chatml"]);
    let chat = format!("{}/v1/chat/completions", server.base);
    let user = json!([{"role": "user", "content": "hi"}]);
    let tool =
        |name: &str, params: Value| json!({"type": "function", "function": {"name": name, "parameters": params}});
    let obj = json!({"type": "object", "properties": {"a": {"type": "string"}}});
    for (body, param, needle) in [
        (json!({"messages": user, "tools": {"a": 1}}), "tools", "`tools` must be an array"),
        (json!({"messages": user, "tools": [{"type": "retrieval"}]}), "tools[0]", "only \"function\" tools"),
        (
            json!({"messages": user, "tools": [{"type": "function"}]}),
            "tools[0]",
            "`tools[0].function` must be an object",
        ),
        (
            json!({"messages": user, "tools": [tool("get weather", obj.clone())]}),
            "tools[0]",
            "has the name \"get weather\"",
        ),
        (
            json!({"messages": user, "tools": [tool("a", obj.clone()), tool("a", obj.clone())]}),
            "tools[1]",
            "both named \"a\"",
        ),
        (
            json!({"messages": user, "tools": [tool("a", json!({"type": "object", "properties": {"n": {"type": "string", "pattern": "a+"}}}))]}),
            "tools[0]",
            "tool 0 (\"a\"): its parameters must be an object schema: JSON schema at '/properties/n': keyword `pattern` is not supported",
        ),
        (
            json!({"messages": user, "tools": [tool("a", json!({"type": "string"}))]}),
            "tools[0]",
            "`type` is \"string\", not \"object\"",
        ),
        (
            json!({"messages": user, "tools": [tool("a", obj.clone())], "tool_choice": "always"}),
            "tool_choice",
            "expected \"none\", \"auto\"",
        ),
        (
            json!({"messages": user, "tools": [tool("a", obj.clone())], "tool_choice": {"type": "function", "function": {"name": "b"}}}),
            "tool_choice",
            "names \"b\", which is not among the tools",
        ),
        (json!({"messages": user, "tool_choice": "required"}), "tool_choice", "needs tools, and none were given"),
        (
            json!({"messages": user, "tools": [tool("a", obj.clone())], "response_format": {"type": "json_object"}}),
            "response_format",
            "cannot be combined with `tools`",
        ),
        (
            json!({"messages": [{"role": "assistant", "content": null, "tool_calls": [{"id": "x", "type": "function", "function": {"name": "a", "arguments": "{oops"}}]}, {"role": "user", "content": "hi"}]}),
            "messages[0].tool_calls",
            "`messages[0].tool_calls[0].function.arguments` is not JSON",
        ),
        (json!({"messages": user, "functions": [{"name": "a"}]}), "functions", "legacy `functions` (use `tools`)"),
    ] {
        let (status, _, text) = post(&chat, body.to_string().as_bytes());
        assert_eq!(status, 400, "{body}: {text}");
        let err: Value = serde_json::from_str(&text).unwrap();
        assert_eq!(err["error"]["param"], json!(param), "{body}: {text}");
        let message = err["error"]["message"].as_str().unwrap();
        assert!(message.contains(needle), "{body}: {message}");
    }
    // Completions have no tools.
    let (status, _, text) = post(
        &format!("{}/v1/completions", server.base),
        json!({"prompt": "a", "tools": [tool("a", obj.clone())]}).to_string().as_bytes(),
    );
    assert!(status == 400 && text.contains("`tools` is a chat field"), "{text}");
    // `none` with tools is a plain reply, and the server is still up.
    let (content, calls, _) =
        whole(&chat, &json!({"messages": user, "tools": [tool("a", obj)], "tool_choice": "none", "max_tokens": 4}));
    assert!(content.is_some() && calls.is_empty());
}

/// SmolLM2 through the official `openai` client: a call that is required, its result sent back as a `tool`
/// message, and a reply in words after it; then tools made from pydantic models (`$defs`, enums, numeric bounds, a
/// tagged union), whose arguments the client parses and validates with pydantic.
#[test]
fn the_openai_client_calls_tools_on_smollm2() {
    let Some(model) = real_model("smollm2") else { return };
    if !crate::common::python_module("openai") {
        return;
    }
    let server = Server::start(&model, &[]);
    let script = r#"
import json, sys
from openai import OpenAI
client = OpenAI(base_url=sys.argv[1] + "/v1", api_key="unused")
tools = [{"type": "function", "function": {
    "name": "get_weather", "description": "The current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]
messages = [{"role": "user", "content": "What is the weather like in Paris today?"}]
r = client.chat.completions.create(model="smollm2", messages=messages, tools=tools, tool_choice="required",
                                   parallel_tool_calls=False, temperature=0, max_tokens=60)
choice = r.choices[0]
assert choice.finish_reason == "tool_calls", choice
call = choice.message.tool_calls[0]
assert call.function.name == "get_weather", call
city = json.loads(call.function.arguments)["city"]
assert isinstance(city, str), call
messages.append(choice.message)
messages.append({"role": "tool", "tool_call_id": call.id, "content": "18 degrees and sunny"})
parts, finish, acc = [], None, {}
for chunk in client.chat.completions.create(model="smollm2", messages=messages, tools=tools, temperature=0,
                                            max_tokens=60, stream=True):
    d = chunk.choices[0].delta
    if d.content:
        parts.append(d.content)
    for tc in d.tool_calls or []:
        e = acc.setdefault(tc.index, {"name": None, "arguments": ""})
        e["name"] = tc.function.name or e["name"]
        e["arguments"] += tc.function.arguments or ""
    finish = chunk.choices[0].finish_reason or finish
if finish == "tool_calls":
    assert acc and all(e["name"] == "get_weather" and "city" in json.loads(e["arguments"]) for e in acc.values()), acc
# pydantic's schemas, as `openai.pydantic_function_tool` writes them ($defs, an enum by $ref, numeric bounds, a
# union of models told apart by a Literal tag), parsed and validated by the client itself.
from enum import Enum
from typing import List, Literal, Union
from pydantic import BaseModel, Field
import openai
class Unit(str, Enum):
    c = "celsius"
    f = "fahrenheit"
class GetWeather(BaseModel):
    """The weather in a city for the next days"""
    city: str
    unit: Unit
    days: int = Field(ge=1, le=7)
class Circle(BaseModel):
    kind: Literal["circle"]
    radius: float = Field(gt=0, le=100)
class Square(BaseModel):
    kind: Literal["square"]
    side: float
class Draw(BaseModel):
    """Draw shapes"""
    shapes: List[Union[Circle, Square]]
typed = [openai.pydantic_function_tool(GetWeather), openai.pydantic_function_tool(Draw)]
parsed = []
for ask, name, seed in [("Weather in Paris for three days?", "GetWeather", 1), ("Draw a circle and a square.", "Draw", 0),
                        ("Draw a circle and a square.", "Draw", 1)]:
    r = client.chat.completions.parse(model="smollm2", messages=[{"role": "user", "content": ask}], tools=typed,
                                      tool_choice={"type": "function", "function": {"name": name}},
                                      parallel_tool_calls=False, temperature=0.7, seed=seed, max_tokens=300)
    (call,) = r.choices[0].message.tool_calls
    assert type(call.function.parsed_arguments).__name__ == name, call
    parsed.append(repr(call.function.parsed_arguments))
    # The same request streamed, put together by the client's own stream helper.
    with client.chat.completions.stream(model="smollm2", messages=[{"role": "user", "content": ask}], tools=typed,
                                        tool_choice={"type": "function", "function": {"name": name}},
                                        parallel_tool_calls=False, temperature=0.7, seed=seed, max_tokens=300) as s:
        final = s.get_final_completion()
    (again,) = final.choices[0].message.tool_calls
    assert again.function.parsed_arguments == call.function.parsed_arguments, (again, call)
print("ok", json.dumps({"city": city, "then": finish, "words": "".join(parts), "parsed": parsed}))
"#;
    let out = std::process::Command::new("python3").args(["-c", script, &server.base]).output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    eprintln!("{stdout}");
    let v: Value = serde_json::from_str(stdout.strip_prefix("ok ").unwrap().trim()).unwrap();
    assert!(v["city"].as_str().unwrap().contains("Paris"), "{v}");
}

/// A call and its results (two `tool` messages) are written back as an assistant turn and one user turn, which
/// Gemma's turn format (user and model only) can hold; the conversation renders on Gemma 3's own template and the
/// model answers.
#[test]
fn a_conversation_with_calls_and_results_renders_on_gemma3() {
    let Some(model) = real_model("gemma3") else { return };
    let server = Server::start(&model, &[]);
    let url = format!("{}/v1/chat/completions", server.base);
    let calls = json!([
        {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\":\"Oslo\"}"}},
        {"id": "call_2", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\":\"Rome\"}"}},
    ]);
    let mut messages = json!([
        {"role": "system", "content": "You are brief."},
        {"role": "user", "content": "Is it warmer in Oslo or in Rome?"},
        {"role": "assistant", "content": null, "tool_calls": calls},
        {"role": "tool", "tool_call_id": "call_1", "content": "3 degrees"},
        {"role": "tool", "tool_call_id": "call_2", "content": "21 degrees"},
    ]);
    let body = json!({"messages": messages.clone(), "tools": tools(), "max_tokens": 40, "temperature": 0});
    let (content, calls_made, finish) = whole(&url, &body);
    eprintln!("{finish}: {content:?} {calls_made:?}");
    assert!(finish == "stop" || finish == "length" || finish == "tool_calls");
    if finish == "tool_calls" {
        calls_made.iter().for_each(|c| check_call(c, &["get_weather", "get_time", "book"]));
    } else {
        let words = content.unwrap();
        assert!(words.contains("Rome"), "{words}");
    }
    // Without tools in the request, the same history renders too (a plain reply).
    messages.as_array_mut().unwrap().push(json!({"role": "user", "content": "Thanks."}));
    messages.as_array_mut().unwrap().insert(5, json!({"role": "assistant", "content": "Rome is warmer."}));
    let (content, calls_made, _) = whole(&url, &json!({"messages": messages, "max_tokens": 8, "temperature": 0}));
    assert!(content.is_some() && calls_made.is_empty());
}

/// The tools of [`tools`] asked for in a template's own `style` under `choice`.
fn native_use(
    style: infer::tools::ToolStyle,
    choice: infer::tools::ToolChoice,
    parallel: bool,
) -> infer::tools::ToolUse {
    use infer::tools::{Tool, ToolUse};
    let list: Vec<Tool> = tools()
        .as_array()
        .unwrap()
        .iter()
        .map(|t| Tool {
            name: t["function"]["name"].as_str().unwrap().into(),
            description: t["function"]["description"].as_str().map(str::to_string),
            parameters: t["function"].get("parameters").cloned(),
        })
        .collect();
    ToolUse::new_in(list, choice, parallel, style).unwrap().unwrap()
}

/// One reply drawn token by token through a template format's constraint on `tok`'s vocabulary. Under `auto`, the
/// reply begins with free tokens (none with a '<' or a '{'): with `words = Some(k)`, k of them and then the walk
/// steers into the call's opening (`<tool_call>\n`, or a bare call's `{`, which only the reply's first token can
/// begin), the longest token that goes on with it at a time; with `None`, words to the end (each step ends the
/// reply with odds 1 in 10). In the calls it draws random allowed tokens, leaning towards those that close
/// strings and objects, and ends the reply where it may with even odds. Every mask is checked against feeding each
/// token to the machine itself (every token for the first `check` steps, every 97th after). Returns the text, and
/// whether it ended (rather than ran into `limit` tokens).
fn native_walk(
    t: &infer::tools::ToolUse,
    tok: &infer::tokenizer::Tokenizer,
    rng: &mut crate::synthetic::Rng,
    words: Option<usize>,
    check: usize,
    limit: usize,
) -> (String, bool) {
    use infer::structured::native_calls::{CallSyntax, NativeCallsMachine, OPEN};
    use infer::structured::{Constraint, OutputFormat, vocab::allows};
    use infer::tokenizer::TokenType;
    let OutputFormat::NativeCalls(spec) = t.format() else { panic!("not tagged") };
    let vocab = std::sync::OnceLock::new();
    let mut c = Constraint::new(&t.format(), &vocab, tok).unwrap();
    let mut machine = NativeCallsMachine::new(&spec);
    let mut text: Vec<u8> = Vec::new();
    let lossy = |t: &[u8]| String::from_utf8_lossy(t).into_owned();
    let steer = match spec.syntax {
        CallSyntax::Hermes => format!("{OPEN}\n"),
        CallSyntax::Llama3 => "{".to_string(),
    };
    let piece = |id: u32| tok.token_bytes(id, true);
    let pick = |from: &[u32], rng: &mut crate::synthetic::Rng| from[(rng.next_u64() % from.len() as u64) as usize];
    for step in 0..limit {
        if c.is_complete() {
            return (lossy(&text), true);
        }
        let mask = c.mask().to_vec();
        let allowed: Vec<u32> = (0..tok.n_vocab() as u32).filter(|&id| allows(&mask, id)).collect();
        assert!(!allowed.is_empty(), "a dead end after {:?}", lossy(&text));
        for id in (0..tok.n_vocab() as u32).step_by(if step < check { 1 } else { 97 }) {
            let expected = if tok.is_eog(id) {
                machine.is_accepting()
            } else {
                !piece(id).is_empty()
                    && !matches!(tok.token_type(id), Some(TokenType::Control | TokenType::Unknown))
                    && machine.clone().feed(&spec, piece(id))
            };
            let shown = String::from_utf8_lossy(piece(id));
            assert_eq!(allows(&mask, id), expected, "token {id} {shown:?} after {:?}", lossy(&text));
        }
        let eog: Vec<u32> = allowed.iter().copied().filter(|&id| tok.is_eog(id)).collect();
        let in_words = spec.lazy
            && match spec.syntax {
                CallSyntax::Hermes => !lossy(&text).contains(OPEN),
                CallSyntax::Llama3 => !text.starts_with(b"{"),
            };
        let id = if in_words && words.is_none_or(|k| step < k) {
            let plain: Vec<u32> = allowed
                .iter()
                .copied()
                .filter(|&id| !tok.is_eog(id) && !piece(id).iter().any(|b| b"<{".contains(b)))
                .collect();
            if words.is_none() && rng.uniform() < 0.1 { pick(&eog, rng) } else { pick(&plain, rng) }
        } else if in_words {
            let done = (0..steer.len()).rev().find(|&k| text.ends_with(&steer.as_bytes()[..k])).unwrap_or(0);
            let rest = &steer.as_bytes()[done..];
            *allowed
                .iter()
                .filter(|&&id| !piece(id).is_empty() && rest.starts_with(piece(id)))
                .max_by_key(|&&id| piece(id).len())
                .unwrap_or_else(|| panic!("no token goes on with {:?}", String::from_utf8_lossy(rest)))
        } else if !eog.is_empty() && rng.uniform() < 0.5 {
            pick(&eog, rng)
        } else {
            let closers: Vec<u32> = allowed
                .iter()
                .copied()
                .filter(|&id| !tok.is_eog(id) && piece(id).iter().any(|b| b"\"}]".contains(b)))
                .collect();
            if !closers.is_empty() && rng.uniform() < 0.4 { pick(&closers, rng) } else { pick(&allowed, rng) }
        };
        c.accept(id, piece(id)).unwrap_or_else(|e| panic!("{e}"));
        if !tok.is_eog(id) {
            assert!(machine.feed(&spec, piece(id)));
            text.extend_from_slice(piece(id));
        }
    }
    (lossy(&text), false)
}

/// The template formats' constraints (Hermes' tags, Llama 3's bare calls) on the synthetic and SmolLM2 vocabularies: every mask equals a token-by-token
/// check against the machine, no walk meets a dead end, and every finished reply reads back into calls that name
/// an allowed tool with arguments of its schema (under `auto`, after the words the walk wrote first), or into the
/// words alone; read a token at a time, it gives the same words and calls.
#[test]
fn template_format_replies_hold_to_the_tools_on_real_and_synthetic_vocabularies() {
    use infer::tools::{ToolChoice, ToolReply, ToolStyle};
    let (_, synthetic) = crate::engine::load(crate::synthetic::Spec::llama(infer::kernels::GgmlType::Q8_0));
    let mut vocabularies = vec![(synthetic, 400)];
    if let Some(path) = real_model("smollm2") {
        let file = infer::gguf::GgufFile::open(&path).unwrap();
        vocabularies.push((infer::tokenizer::Tokenizer::from_gguf(&file).unwrap(), 3));
    }
    let all = ["get_weather", "get_time", "book"];
    let mut rng = crate::synthetic::Rng::new(11);
    let (mut finished, mut with_words, mut words_only) = (0, 0, 0);
    for (tok, check) in &vocabularies {
        let (tok, check) = (tok, *check);
        for (style, choice, parallel, words) in [
            (ToolStyle::Hermes, ToolChoice::Required, true, None),
            (ToolStyle::Hermes, ToolChoice::Function("book".into()), false, None),
            (ToolStyle::Hermes, ToolChoice::Auto, true, Some(6)),
            (ToolStyle::Hermes, ToolChoice::Auto, false, None),
            (ToolStyle::Llama3, ToolChoice::Required, true, None),
            (ToolStyle::Llama3, ToolChoice::Auto, false, Some(0)),
            (ToolStyle::Llama3, ToolChoice::Auto, false, None),
        ] {
            let t = native_use(style, choice.clone(), parallel);
            for _ in 0..4 {
                let (text, ended) = native_walk(&t, tok, &mut rng, words, check, 400);
                if !ended {
                    continue;
                }
                finished += 1;
                let mut reader = t.reader();
                let mut pieces = Vec::new();
                // A token's worth at a time would do; a character at a time is harder.
                for ch in text.chars() {
                    pieces.extend(reader.push(&ch.to_string()));
                }
                pieces.extend(reader.finish());
                let (streamed_words, streamed_calls) = infer::tools::words_and_calls(pieces);
                match t.read(&text) {
                    Some(ToolReply::Calls(calls)) => {
                        let allowed: &[&str] =
                            if choice == ToolChoice::Auto || choice == ToolChoice::Required { &all } else { &["book"] };
                        let most = if parallel && style == ToolStyle::Hermes { infer::tools::MAX_CALLS } else { 1 };
                        assert!(calls.len() <= most, "{text}");
                        for call in &calls {
                            let v = json!({"id": call.id, "type": "function",
                                           "function": {"name": call.name, "arguments": call.arguments}});
                            check_call(&v, allowed);
                        }
                        let got: Vec<_> = streamed_calls.iter().map(|c| (&c.name, &c.arguments)).collect();
                        let want: Vec<_> = calls.iter().map(|c| (&c.name, &c.arguments)).collect();
                        assert_eq!(got, want, "{text:?}");
                        let before = &text[..text.find("<tool_call>").unwrap_or(0)];
                        assert_eq!(streamed_words, before);
                        with_words += usize::from(!before.is_empty());
                    }
                    Some(ToolReply::Text(words)) => {
                        assert_eq!(choice, ToolChoice::Auto, "{text:?}");
                        assert_eq!((words.as_str(), streamed_words.as_str()), (text.as_str(), text.as_str()));
                        assert!(streamed_calls.is_empty());
                        words_only += 1;
                    }
                    None => panic!("{choice:?}: a finished reply that does not read back: {text:?}"),
                }
            }
        }
    }
    eprintln!("finished {finished}, calls after words {with_words}, words alone {words_only}");
    assert!(finished >= 20 && with_words >= 4 && words_only >= 4, "{finished} {with_words} {words_only}");
}

/// `serve` with templates that have their own call format (`tests/data/tagged-tools.jinja`, written like Hermes'
/// and Qwen's; `tests/data/llama3-tools.jinja`, like Llama 3.1's): the template lists the tools (so the prompt grows
/// by the list and `/tokenize` counts it as a request does), replies that must call are written in the template's
/// format and read back into calls of the declared tools with arguments of their schemas, `auto` leaves the random
/// model its words, and streamed replies equal whole ones.
#[test]
fn templates_with_their_own_call_format_take_the_tools_and_replies_call_in_it() {
    for (file, most) in [("tagged-tools.jinja", infer::tools::MAX_CALLS), ("llama3-tools.jinja", 1)] {
        template_calls(file, most);
    }
}

fn template_calls(file: &str, most_calls: usize) {
    let dir = tempdir();
    let template = format!("{}/tests/data/{file}", env!("CARGO_MANIFEST_DIR"));
    let server = Server::start(&tiny_model(dir.path()), &["--chat-template", &template]);
    assert!(server.log().iter().any(|l| l.starts_with("tools: the chat template lists them")), "{:?}", server.log());
    let url = format!("{}/v1/chat/completions", server.base);
    let all = ["get_weather", "get_time", "book"];
    let messages = json!([{"role": "user", "content": "Book me two seats, and what is the weather?"}]);
    let count = |body: &Value| {
        let (status, _, text) = post(&format!("{}/tokenize", server.base), body.to_string().as_bytes());
        assert_eq!(status, 200, "{text}");
        serde_json::from_str::<Value>(&text).unwrap()["tokens"].as_array().unwrap().len()
    };
    let plain = count(&json!({"messages": messages}));
    let listed = count(&json!({"messages": messages, "tools": tools()}));
    assert!(listed > plain + tools().to_string().len() / 2, "{plain} → {listed} tokens");
    let mut names_seen = std::collections::BTreeSet::new();
    for (choice, parallel, seeds) in [
        (json!("required"), true, 0..4),
        (json!({"type": "function", "function": {"name": "book"}}), false, 0..2),
        (json!("auto"), true, 0..3),
    ] {
        for seed in seeds {
            // Hot, so that the random model's calls differ; its words are cut short.
            let max_tokens = if choice == json!("auto") { 64 } else { 3000 };
            let body = json!({"messages": messages, "tools": tools(), "tool_choice": choice,
                              "parallel_tool_calls": parallel, "max_tokens": max_tokens, "seed": seed,
                              "temperature": 3.0, "top_k": 0, "top_p": 1, "min_p": 0});
            let (status, _, text) = post(&url, body.to_string().as_bytes());
            assert_eq!(status, 200, "{text}");
            let v: Value = serde_json::from_str(&text).unwrap();
            assert_eq!(v["usage"]["prompt_tokens"], listed, "the prompt is the one /tokenize counts");
            let (content, calls, finish) = whole(&url, &body);
            eprintln!("{file} {choice} seed {seed}: {finish} {content:?} {}", json!(without_ids(&calls)));
            if choice == json!("auto") {
                // The random model never writes the tag's eleven bytes, and rarely a first '{': words, whole.
                if finish == "tool_calls" {
                    calls.iter().for_each(|c| check_call(c, &all));
                } else {
                    assert!(calls.is_empty() && !content.as_deref().unwrap().contains("<tool_call>"));
                }
            } else {
                assert_eq!(finish, "tool_calls", "{content:?}");
                let allowed: &[&str] = if choice.is_object() { &["book"] } else { &all };
                assert!(!calls.is_empty() && calls.len() <= if parallel { most_calls } else { 1 });
                for call in &calls {
                    check_call(call, allowed);
                    names_seen.insert(call["function"]["name"].as_str().unwrap().to_string());
                }
            }
            let ((s_content, s_calls, s_finish), _) = streamed(&url, &body);
            assert_eq!((s_finish.as_str(), without_ids(&s_calls)), (finish.as_str(), without_ids(&calls)));
            assert_eq!(s_content, content);
        }
    }
    assert!(names_seen.len() >= 2, "{names_seen:?}");
}
