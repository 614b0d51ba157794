//! Tool (function) calling that works with any chat template.
//!
//! Few GGUF chat templates describe tools, and those that do each want their own reply format. Where the template
//! is of the Hermes kind ([`ToolStyle::Hermes`]: Qwen 2.5 and 3, Hermes 2 and 3 and their fine-tunes) or of Llama
//! 3.1's ([`ToolStyle::Llama3`]), the tools go to the template, which lists them as the model was trained to read
//! them, and the reply is held to that template's own call format ([`crate::structured::native_calls`]): under
//! `auto` the model writes words freely, and a call where the format lets one begin. Every other template gets the one route every model can follow
//! ([`ToolStyle::Json`]): the tools and a JSON reply format are described in the system message, and
//! the reply is held to that format by a JSON schema ([`crate::structured`]), so a model of any size writes a call
//! that parses, names a declared tool and carries arguments of that tool's `parameters` schema:
//!
//! - `{"tool_calls": [{"name": "get_weather", "arguments": {"city": "Oslo"}}]}` to call tools;
//! - `{"response": "..."}` to answer in words (unless the caller requires a call).
//!
//! The two shapes, and the tools within `tool_calls`, are object alternatives told apart by their first property
//! (its name, then the `name` tag). Earlier calls and their results in the conversation are written back in the same
//! shapes (the results as a user message), so the model sees one consistent protocol and templates that insist on
//! alternating user and assistant turns (Gemma's) still render.
//!
//! Nothing here knows HTTP: the OpenAI layer ([`crate::server::openai`]) parses requests into [`ToolUse`] and turns
//! [`ToolReply`] into its response shapes.

use std::sync::Arc;

use serde_json::{Map, Value, json};

use crate::structured::native_calls::{CLOSE, CallSyntax, OPEN};
use crate::structured::{JsonSchema, NativeCalls, OutputFormat, SchemaError};
use crate::tokenizer::chat::ChatMessage;

/// Most tools one request may declare (OpenAI's limit).
pub const MAX_TOOLS: usize = 128;
/// Most calls one reply may make when parallel calls are allowed.
pub const MAX_CALLS: usize = 8;
/// Longest tool name (OpenAI's limit).
pub const MAX_NAME: usize = 64;

/// A function the model may call.
#[derive(Debug, Clone, PartialEq)]
pub struct Tool {
    /// Letters, digits, `_` and `-`, at most [`MAX_NAME`].
    pub name: String,
    pub description: Option<String>,
    /// The JSON schema of its arguments (an object schema); `None`: it takes none.
    pub parameters: Option<Value>,
}

/// Whether and which tools the model may or must call.
#[derive(Debug, Clone, PartialEq)]
pub enum ToolChoice {
    /// No calls: the reply is free text (the tools are not described).
    None,
    /// A call or an answer in words, as the model chooses.
    Auto,
    /// At least one call, of any tool.
    Required,
    /// A call of this tool.
    Function(String),
}

/// Why a request's tools cannot be used; `index` is the tool's place in the request's list.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ToolError {
    #[error("tool {index} has the name \"{name}\": a name is 1 to {MAX_NAME} letters, digits, '_' or '-'")]
    BadName { index: usize, name: String },
    #[error("tools {first} and {second} are both named \"{name}\"")]
    Duplicate { first: usize, second: usize, name: String },
    #[error("{count} tools: at most {MAX_TOOLS}")]
    TooMany { count: usize },
    #[error("tool {index} (\"{name}\"): its parameters must be an object schema: {problem}")]
    Parameters { index: usize, name: String, problem: String },
    #[error("the tool choice names \"{name}\", which is not among the tools")]
    UnknownChoice { name: String },
    #[error("the tool choice {choice} needs tools, and none were given")]
    NoTools { choice: &'static str },
    #[error("the tools together: {0}")]
    Schema(SchemaError),
}

/// How the model is asked to call tools: in the template's own format, or in this module's JSON protocol.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ToolStyle {
    /// The JSON protocol, described in the system message: for any template.
    #[default]
    Json,
    /// The template lists the tools itself (it is given them as `tools`) and teaches the model to answer with
    /// `<tool_call>` tags around `{"name": ..., "arguments": ...}` (Hermes 2 Pro's format, which Qwen took over).
    /// Earlier calls and results reach the template as its own messages (`tool_calls`, role `tool`).
    Hermes,
    /// Llama 3.1 to 3.3: the template lists the tools and asks for one bare `{"name": ..., "parameters": ...}` as
    /// the reply; results go back as its `ipython` turns (it renders `tool` messages so).
    Llama3,
}

impl ToolStyle {
    /// The style a chat template's source teaches: Hermes where it writes both tags, lists `tools` and names the
    /// `arguments` (as Qwen's and Hermes' templates do); Llama 3 where it has Llama 3's headers, lists `tools`,
    /// names the `parameters` and has `ipython` turns; JSON for every other template.
    pub fn of_template(source: &str) -> ToolStyle {
        let has = |words: &[&str]| words.iter().all(|w| source.contains(w));
        if has(&[OPEN, CLOSE, "tools", "arguments"]) {
            ToolStyle::Hermes
        } else if has(&["<|start_header_id|>", "ipython", "tools", "parameters"]) {
            ToolStyle::Llama3
        } else {
            ToolStyle::Json
        }
    }

    /// What the model writes to call, in words.
    pub fn calls_as(self) -> &'static str {
        match self {
            ToolStyle::Json => "the JSON protocol in the system message",
            ToolStyle::Hermes => "<tool_call> tags",
            ToolStyle::Llama3 => "a bare {\"name\", \"parameters\"} object",
        }
    }

    /// The syntax of the template's own calls (`None` for the JSON protocol).
    fn syntax(self) -> Option<CallSyntax> {
        match self {
            ToolStyle::Json => None,
            ToolStyle::Hermes => Some(CallSyntax::Hermes),
            ToolStyle::Llama3 => Some(CallSyntax::Llama3),
        }
    }
}

/// A request's tools, with the reply format they compile to. Exists only when calls are possible (a choice other
/// than [`ToolChoice::None`], at least one tool).
#[derive(Debug)]
pub struct ToolUse {
    tools: Vec<Tool>,
    choice: ToolChoice,
    parallel: bool,
    reply: ReplyFormat,
}

/// What a reply is held to, compiled for the style the tools are asked for in.
#[derive(Debug)]
enum ReplyFormat {
    /// The JSON protocol's reply schema.
    Json(Arc<JsonSchema>),
    /// The template's own call format.
    Native(Arc<NativeCalls>),
}

impl PartialEq for ToolUse {
    /// The same tools and choice (the schema follows from them).
    fn eq(&self, other: &Self) -> bool {
        self.tools == other.tools
            && self.choice == other.choice
            && self.parallel == other.parallel
            && self.style() == other.style()
    }
}

/// One call the model made.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolCall {
    /// Fresh for each call (`call_` and 24 hex digits), for the caller to name its result by.
    pub id: String,
    pub name: String,
    /// An object of the tool's `parameters` schema, as the model wrote it (JSON text: re-serializing could change
    /// it, a long integer into a float).
    pub arguments: String,
}

/// What a reply under [`ToolUse`] said.
#[derive(Debug, Clone, PartialEq)]
pub enum ToolReply {
    Calls(Vec<ToolCall>),
    /// An answer in words.
    Text(String),
}

/// A call made earlier in a conversation (an assistant message's `tool_calls`).
#[derive(Debug, Clone, PartialEq)]
pub struct PastCall {
    pub id: String,
    pub name: String,
    pub arguments: Value,
}

/// The result of an earlier call (a `tool` message).
#[derive(Debug, Clone, PartialEq)]
pub struct ToolResult {
    pub call_id: Option<String>,
    /// The tool's name, from the call the result answers (or the message's own `name`).
    pub name: Option<String>,
    pub content: String,
}

impl ToolUse {
    /// The tools and choice of a request in the JSON protocol; `None` when no call is possible (no tools, or the
    /// choice `none`).
    pub fn new(tools: Vec<Tool>, choice: ToolChoice, parallel: bool) -> Result<Option<ToolUse>, ToolError> {
        ToolUse::new_in(tools, choice, parallel, ToolStyle::Json)
    }

    /// [`new`](Self::new) with the calls asked for in `style`.
    pub fn new_in(
        tools: Vec<Tool>,
        choice: ToolChoice,
        parallel: bool,
        style: ToolStyle,
    ) -> Result<Option<ToolUse>, ToolError> {
        if tools.len() > MAX_TOOLS {
            return Err(ToolError::TooMany { count: tools.len() });
        }
        for (index, t) in tools.iter().enumerate() {
            let ok = !t.name.is_empty()
                && t.name.len() <= MAX_NAME
                && t.name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
            if !ok {
                return Err(ToolError::BadName { index, name: t.name.clone() });
            }
            if let Some(first) = tools[..index].iter().position(|u| u.name == t.name) {
                return Err(ToolError::Duplicate { first, second: index, name: t.name.clone() });
            }
            // Each tool's schema alone first, so that an error names the tool and a place inside its own schema.
            let params = arguments_schema(t);
            let problem = match JsonSchema::compile(&params) {
                Err(e) => Some(e.to_string()),
                Ok(_) if params.get("type").and_then(Value::as_str) != Some("object") => {
                    Some(format!("`type` is {}, not \"object\"", params.get("type").unwrap_or(&Value::Null)))
                }
                Ok(_) => None,
            };
            if let Some(problem) = problem {
                return Err(ToolError::Parameters { index, name: t.name.clone(), problem });
            }
        }
        match &choice {
            ToolChoice::None => return Ok(None),
            ToolChoice::Function(name) if !tools.iter().any(|t| &t.name == name) => {
                return Err(ToolError::UnknownChoice { name: name.clone() });
            }
            ToolChoice::Required | ToolChoice::Function(_) if tools.is_empty() => {
                return Err(ToolError::NoTools { choice: choice_name(&choice) });
            }
            _ if tools.is_empty() => return Ok(None),
            _ => {}
        }
        let reply = match style.syntax() {
            None => {
                let source = reply_schema(&tools, &choice, parallel);
                ReplyFormat::Json(Arc::new(JsonSchema::compile(&source).map_err(ToolError::Schema)?))
            }
            Some(syntax) => {
                let call = call_alternatives(&tools, &choice, syntax.arguments_key());
                let call = Arc::new(JsonSchema::compile(&call).map_err(ToolError::Schema)?);
                let lazy = choice == ToolChoice::Auto;
                // A bare call is the whole reply.
                let max_calls = if parallel && syntax == CallSyntax::Hermes { MAX_CALLS as u8 } else { 1 };
                ReplyFormat::Native(Arc::new(NativeCalls { syntax, call, lazy, max_calls }))
            }
        };
        Ok(Some(ToolUse { tools, choice, parallel, reply }))
    }

    /// The style the calls are asked for in.
    pub fn style(&self) -> ToolStyle {
        match &self.reply {
            ReplyFormat::Json(_) => ToolStyle::Json,
            ReplyFormat::Native(n) => match n.syntax {
                CallSyntax::Hermes => ToolStyle::Hermes,
                CallSyntax::Llama3 => ToolStyle::Llama3,
            },
        }
    }

    /// The format a reply is held to.
    pub fn format(&self) -> OutputFormat {
        match &self.reply {
            ReplyFormat::Json(schema) => OutputFormat::JsonSchema(schema.clone()),
            ReplyFormat::Native(n) => OutputFormat::NativeCalls(n.clone()),
        }
    }

    /// The tools as a template with its own call format takes them (`tools`: OpenAI's request shape); `None` in
    /// the JSON style, whose tools are in the system message.
    pub fn template_tools(&self) -> Option<Value> {
        let ReplyFormat::Native(_) = self.reply else { return None };
        Some(self.tools.iter().map(|t| json!({"type": "function", "function": tool_entry(t)})).collect())
    }

    /// A reader of replies in this style.
    pub fn reader(&self) -> CallReader {
        match &self.reply {
            ReplyFormat::Json(_) => CallReader::Json(ReplyReader::default()),
            ReplyFormat::Native(n) => CallReader::Native(NativeReader::new(n.syntax)),
        }
    }

    /// What the system message gains: the tools, then the reply format (last, so that requests with the same tools
    /// and different choices still share the prefix cache's blocks of the list).
    pub fn instruction(&self) -> String {
        let mut out = String::from("You can call these tools:\n");
        for t in &self.tools {
            out.push_str(&tool_entry(t).to_string());
            out.push('\n');
        }
        let calls = if self.parallel {
            format!("one entry per call, at most {MAX_CALLS}")
        } else {
            "exactly one entry".to_string()
        };
        let call_shape =
            format!("{{\"tool_calls\": [{{\"name\": <tool name>, \"arguments\": {{<its parameters>}}}}]}} ({calls})");
        out.push_str("Reply with one JSON object and nothing else:\n");
        match &self.choice {
            ToolChoice::Auto | ToolChoice::None => {
                out.push_str(&format!("- to call tools: {call_shape};\n"));
                out.push_str("- to answer without a tool: {\"response\": <your answer as a string>}.\n");
            }
            ToolChoice::Required => out.push_str(&format!("- call one or more of the tools: {call_shape}.\n")),
            ToolChoice::Function(name) => {
                out.push_str(&format!("- call the tool \"{name}\": {call_shape}.\n"));
            }
        }
        out.push_str("Results of calls come back as {\"tool_results\": [...]}.");
        out
    }

    /// Adds [`instruction`](Self::instruction) to the conversation's system message (one is put first if there is
    /// none), in the JSON style; a template with its own call format lists the tools itself.
    pub fn prompt(&self, messages: &mut Vec<ChatMessage>) {
        if let ReplyFormat::Native(_) = self.reply {
            return;
        }
        let text = self.instruction();
        match messages.first_mut() {
            Some(m) if m.role == "system" => {
                m.content = format!("{}\n\n{text}", m.content.trim_end());
            }
            _ => messages.insert(0, ChatMessage::new("system", text)),
        }
    }

    /// The reply's calls or answer; `None` when the text is not a whole reply (generation stopped early).
    pub fn read(&self, text: &str) -> Option<ToolReply> {
        let mut reader = self.reader();
        let pieces = reader.push_end(text);
        let whole = match &reader {
            CallReader::Json(r) => r.is_complete(),
            // Words are a whole reply once the text ends.
            CallReader::Native(_) => reader.is_complete() || reader.is_response(),
        };
        whole.then(|| ToolReply::of(pieces))
    }
}

impl ToolReply {
    /// What `pieces` (all a reader gave for one reply) say: the calls, if any began, else the words.
    pub fn of(pieces: Vec<ReplyPiece>) -> ToolReply {
        let (words, calls) = words_and_calls(pieces);
        if calls.is_empty() { ToolReply::Text(words) } else { ToolReply::Calls(calls) }
    }
}

/// The words and the calls of `pieces` (all a reader gave for one reply).
pub fn words_and_calls(pieces: Vec<ReplyPiece>) -> (String, Vec<ToolCall>) {
    let mut words = String::new();
    let mut calls: Vec<ToolCall> = Vec::new();
    for p in pieces {
        match p {
            ReplyPiece::Words(w) => words.push_str(&w),
            ReplyPiece::CallStart { id, name, .. } => calls.push(ToolCall { id, name, arguments: String::new() }),
            ReplyPiece::Arguments { index, text } => calls[index].arguments.push_str(&text),
        }
    }
    (words, calls)
}

/// An assistant message's earlier calls as templates with their own call format take them (`tool_calls` in OpenAI's shape, with the
/// arguments as an object, which the templates write out with `tojson`).
pub fn past_calls_json(calls: &[PastCall]) -> Value {
    calls
        .iter()
        .map(|c| json!({"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}))
        .collect()
}

/// The name a tool choice has in requests.
pub fn choice_name(c: &ToolChoice) -> &'static str {
    match c {
        ToolChoice::None => "\"none\"",
        ToolChoice::Auto => "\"auto\"",
        ToolChoice::Required => "\"required\"",
        ToolChoice::Function(_) => "of a named function",
    }
}

/// An earlier assistant turn's calls as the model is asked to write them (after any words it said).
pub fn calls_text(content: &str, calls: &[PastCall]) -> String {
    let list: Vec<Value> = calls.iter().map(|c| json!({"name": c.name, "arguments": c.arguments})).collect();
    let json = json!({ "tool_calls": list }).to_string();
    if content.trim().is_empty() { json } else { format!("{}\n{json}", content.trim_end()) }
}

/// Results of earlier calls as one user message.
pub fn results_text(results: &[ToolResult]) -> String {
    let list: Vec<Value> = results
        .iter()
        .map(|r| {
            let mut o = Map::new();
            if let Some(id) = &r.call_id {
                o.insert("tool_call_id".into(), json!(id));
            }
            if let Some(name) = &r.name {
                o.insert("name".into(), json!(name));
            }
            o.insert("content".into(), json!(r.content));
            Value::Object(o)
        })
        .collect();
    json!({ "tool_results": list }).to_string()
}

/// A tool as the instruction and the templates list it: its name, description and arguments schema.
fn tool_entry(t: &Tool) -> Value {
    let mut entry = Map::new();
    entry.insert("name".into(), json!(t.name));
    if let Some(d) = &t.description {
        entry.insert("description".into(), json!(d));
    }
    entry.insert("parameters".into(), arguments_schema(t));
    Value::Object(entry)
}

/// A tool's arguments schema: its `parameters`, or an object with no properties.
fn arguments_schema(t: &Tool) -> Value {
    t.parameters.clone().unwrap_or_else(|| json!({"type": "object", "properties": {}, "additionalProperties": false}))
}

/// The schema of one call, `{"name": ..., "arguments": {...}}`: one alternative per allowed tool, told apart by its
/// `name`, under `anyOf`; each tool's arguments schema sits under the returned `$defs`, its local `$ref`s (written
/// against its own root, as pydantic writes them) pointed at their new place.
fn call_alternatives(tools: &[Tool], choice: &ToolChoice, arguments_key: &str) -> Value {
    let mut defs = Map::new();
    let mut calls = Vec::new();
    for (i, t) in tools.iter().enumerate() {
        if matches!(choice, ToolChoice::Function(n) if *n != t.name) {
            continue;
        }
        let def = format!("tool{i}");
        defs.insert(def.clone(), rebase_refs(arguments_schema(t), &format!("/$defs/{def}")));
        // `name` first: the alternatives are told apart by it.
        let mut properties = Map::new();
        properties.insert("name".into(), json!({"const": t.name}));
        properties.insert(arguments_key.into(), json!({"$ref": format!("#/$defs/{def}")}));
        calls.push(json!({"type": "object", "properties": properties, "required": ["name", arguments_key]}));
    }
    json!({"anyOf": calls, "$defs": defs})
}

/// The schema of a reply in the JSON protocol: `{"tool_calls": [...]}` of [`call_alternatives`], and for `auto`
/// also `{"response": "..."}`.
fn reply_schema(tools: &[Tool], choice: &ToolChoice, parallel: bool) -> Value {
    let mut call = call_alternatives(tools, choice, "arguments");
    let defs = call.as_object_mut().and_then(|o| o.remove("$defs")).unwrap_or_default();
    let max = if parallel { MAX_CALLS } else { 1 };
    let call_list = json!({
        "type": "object",
        "properties": {"tool_calls": {"type": "array", "items": call, "minItems": 1, "maxItems": max}},
        "required": ["tool_calls"],
    });
    let mut root = match choice {
        ToolChoice::Auto | ToolChoice::None => json!({"anyOf": [
            call_list,
            {"type": "object", "properties": {"response": {"type": "string"}}, "required": ["response"]},
        ]}),
        ToolChoice::Required | ToolChoice::Function(_) => call_list,
    };
    root["$defs"] = defs;
    root
}

/// `schema` with every local `$ref` (`#...`, written against the schema's own root) moved under `base`, the JSON
/// pointer where the schema now sits in a larger document.
fn rebase_refs(schema: Value, base: &str) -> Value {
    match schema {
        Value::Object(o) => Value::Object(
            o.into_iter()
                .map(|(k, v)| match (k.as_str(), v) {
                    ("$ref", Value::String(r)) if r.starts_with('#') => {
                        let moved = format!("#{base}{}", &r[1..]);
                        (k, Value::String(moved))
                    }
                    (_, v) => (k, rebase_refs(v, base)),
                })
                .collect(),
        ),
        Value::Array(a) => Value::Array(a.into_iter().map(|v| rebase_refs(v, base)).collect()),
        v => v,
    }
}

/// A fresh call id.
fn call_id() -> String {
    let a = crate::sampling::random_seed();
    let b = crate::sampling::random_seed();
    format!("call_{:016x}{:08x}", a, b as u32)
}

/// What a reply under [`ToolUse`] has said since the last piece, as [`ReplyReader`] finds it.
#[derive(Debug, Clone, PartialEq)]
pub enum ReplyPiece {
    /// More words of a `{"response": ...}` reply.
    Words(String),
    /// Call `index` begins: its fresh id and the tool's name.
    CallStart { index: usize, id: String, name: String },
    /// More of call `index`'s arguments (JSON text, whitespace between tokens left out).
    Arguments { index: usize, text: String },
}

/// Reads a reply under [`ToolUse`] while it is being written, so that it can be streamed as OpenAI streams: the
/// words of an answer as they come, each call's name once known and its arguments piece by piece. It follows the
/// shapes the reply schema allows (any whitespace between tokens); on anything else it stops reading.
#[derive(Debug, Default)]
pub struct ReplyReader {
    raw: String,
    /// Bytes of `raw` read so far.
    pos: usize,
    at: ReplyAt,
    /// The first half of a surrogate pair in the words (`\uD83D` before `\uDE00`).
    high: Option<u16>,
    /// Calls begun so far.
    calls: usize,
    /// The calls' arguments are under `parameters` (Llama 3's calls), not `arguments`.
    parameters: bool,
    /// Inside the arguments: open brackets, and where in a string.
    depth: u32,
    in_string: bool,
    escaped: bool,
}

#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
enum ReplyAt {
    /// Before the first key.
    #[default]
    Opening,
    /// Inside the words of `{"response": "`.
    Words,
    /// After `"tool_calls"`: `:` and `[`.
    CallList,
    /// Before a call: `{"name": "`.
    CallOpen,
    /// Inside the name.
    Name,
    /// After the name: `, "arguments":`.
    ArgumentsKey,
    /// Inside the arguments.
    Arguments,
    /// After the arguments: `}`, then `,` or `]`.
    CallClose,
    AfterCall,
    /// After the words or the list of calls: the reply's closing `}`.
    Closing,
    /// Read to its end.
    Done,
    /// Not a reply of these shapes.
    Other,
}

impl ReplyReader {
    /// The reply so far, as written.
    pub fn raw(&self) -> &str {
        &self.raw
    }

    /// Whether the reply is (so far) an answer in words.
    pub fn is_response(&self) -> bool {
        self.calls == 0 && matches!(self.at, ReplyAt::Words | ReplyAt::Closing | ReplyAt::Done)
    }

    /// Whether the reply has been read to its closing brace.
    pub fn is_complete(&self) -> bool {
        self.at == ReplyAt::Done
    }

    /// Calls begun so far.
    pub fn calls(&self) -> usize {
        self.calls
    }

    /// Takes the next piece of the reply and returns what it completes.
    pub fn push(&mut self, piece: &str) -> Vec<ReplyPiece> {
        self.raw.push_str(piece);
        let mut out = Vec::new();
        let mut words = String::new();
        let mut args = String::new();
        loop {
            let step = match self.at {
                ReplyAt::Opening => self.opening(),
                ReplyAt::Words => self.words(&mut words),
                ReplyAt::CallList => self.expect(&[":", "["]).map(|_| ReplyAt::CallOpen),
                ReplyAt::CallOpen => self.expect(&["{", "\"name\"", ":", "\""]).map(|_| ReplyAt::Name),
                ReplyAt::Name => self.raw[self.pos..].find('"').map(|end| {
                    let name = self.raw[self.pos..self.pos + end].to_string();
                    self.pos += end + 1;
                    out.push(ReplyPiece::CallStart { index: self.calls, id: call_id(), name });
                    self.calls += 1;
                    ReplyAt::ArgumentsKey
                }),
                ReplyAt::ArgumentsKey => {
                    let key = if self.parameters { "\"parameters\"" } else { "\"arguments\"" };
                    self.expect(&[",", key, ":"]).map(|_| ReplyAt::Arguments)
                }
                ReplyAt::Arguments => self.arguments(&mut args),
                ReplyAt::CallClose => self.expect(&["}"]).map(|_| ReplyAt::AfterCall),
                ReplyAt::AfterCall => match self.keys_ws(&[",", "]"]) {
                    Some(Some(0)) => Some(ReplyAt::CallOpen),
                    Some(Some(_)) => Some(ReplyAt::Closing),
                    Some(None) => Some(ReplyAt::Other),
                    None => None,
                },
                ReplyAt::Closing => self.expect(&["}"]).map(|_| ReplyAt::Done),
                ReplyAt::Done | ReplyAt::Other => None,
            };
            if !args.is_empty() && (step.is_none() || step == Some(ReplyAt::CallClose)) {
                out.push(ReplyPiece::Arguments { index: self.calls - 1, text: std::mem::take(&mut args) });
            }
            match step {
                Some(next) => self.at = next,
                None => break,
            }
        }
        if !words.is_empty() {
            out.insert(0, ReplyPiece::Words(words));
        }
        out
    }

    /// Whether the reply is not of the shapes read here (nothing of it is then given as pieces).
    pub fn is_other(&self) -> bool {
        self.at == ReplyAt::Other
    }

    /// Whether a call's object has just closed (a `,` or the list's `]` comes next).
    fn after_call(&self) -> bool {
        self.at == ReplyAt::AfterCall
    }

    /// `{"response": "` or `{"tool_calls"`: the state after it, `None` (nothing taken) if the text ends first.
    fn opening(&mut self) -> Option<ReplyAt> {
        let start = self.pos;
        self.expect(&["{", "\""])?;
        let next = match self.keys(&["response\"", "tool_calls\""]) {
            Some(Some(0)) => self.expect(&[":", "\""]).map(|_| ReplyAt::Words),
            Some(Some(_)) => Some(ReplyAt::CallList),
            Some(None) => Some(ReplyAt::Other),
            None => None,
        };
        if next.is_none() && self.at != ReplyAt::Other {
            self.pos = start;
        }
        next
    }

    /// Skips whitespace and takes each of `parts` in turn (whitespace allowed between them): `Some` once all are
    /// taken, `None` if the text ends first (nothing is taken then). Anything else ends the reading.
    fn expect(&mut self, parts: &[&str]) -> Option<()> {
        let start = self.pos;
        for part in parts {
            match self.keys_ws(&[part]) {
                Some(Some(_)) => {}
                Some(None) => {
                    self.at = ReplyAt::Other;
                    return None;
                }
                None => {
                    self.pos = start;
                    return None;
                }
            }
        }
        Some(())
    }

    /// [`keys`](Self::keys) after whitespace.
    fn keys_ws(&mut self, options: &[&str]) -> Option<Option<usize>> {
        let start = self.pos;
        while self.raw.as_bytes().get(self.pos).is_some_and(|b| b.is_ascii_whitespace()) {
            self.pos += 1;
        }
        let r = self.keys(options);
        if r.is_none() {
            self.pos = start;
        }
        r
    }

    /// Which of `options` the text goes on with (taking it): `Some(None)` for none of them, `None` if the text ends
    /// before that is known.
    fn keys(&mut self, options: &[&str]) -> Option<Option<usize>> {
        let have = &self.raw.as_bytes()[self.pos..];
        let mut waiting = false;
        for (i, o) in options.iter().enumerate() {
            let n = have.len().min(o.len());
            if have[..n] == o.as_bytes()[..n] {
                if n == o.len() {
                    self.pos += n;
                    return Some(Some(i));
                }
                waiting = true;
            }
        }
        if waiting { None } else { Some(None) }
    }

    /// Words up to the closing quote (decoded into `out`); `Some(Closing)` there, `None` when the text ends first.
    fn words(&mut self, out: &mut String) -> Option<ReplyAt> {
        while let Some(c) = self.raw[self.pos..].chars().next() {
            match c {
                '"' => {
                    self.pos += 1;
                    return Some(ReplyAt::Closing);
                }
                '\\' => {
                    let (decoded, used) = unescape(&self.raw[self.pos..])?;
                    self.pos += used;
                    match decoded {
                        Escaped::Char(c) => out.push(c),
                        Escaped::Unit(u) if (0xD800..0xDC00).contains(&u) => self.high = Some(u),
                        Escaped::Unit(u) => {
                            let c = match self.high.take() {
                                Some(h) if (0xDC00..0xE000).contains(&u) => {
                                    char::from_u32(0x10000 + ((u32::from(h) - 0xD800) << 10) + (u32::from(u) - 0xDC00))
                                }
                                _ => char::from_u32(u32::from(u)),
                            };
                            out.push(c.unwrap_or(char::REPLACEMENT_CHARACTER));
                        }
                    }
                }
                c => {
                    out.push(c);
                    self.pos += c.len_utf8();
                }
            }
        }
        None
    }

    /// The arguments' text into `out` (whitespace between tokens left out) up to the bracket that closes them;
    /// `Some(CallClose)` there, `None` when the text ends first.
    fn arguments(&mut self, out: &mut String) -> Option<ReplyAt> {
        while let Some(c) = self.raw[self.pos..].chars().next() {
            self.pos += c.len_utf8();
            if self.in_string {
                self.in_string = self.escaped || c != '"';
                self.escaped = !self.escaped && c == '\\';
            } else if c.is_ascii_whitespace() {
                continue;
            } else if c == '"' {
                self.in_string = true;
            } else if c == '{' || c == '[' {
                self.depth += 1;
            } else if c == '}' || c == ']' {
                self.depth = self.depth.saturating_sub(1);
            }
            out.push(c);
            if self.depth == 0 && !self.in_string {
                return Some(ReplyAt::CallClose);
            }
        }
        None
    }
}

/// Reads a reply in a template's own call format ([`ToolStyle::Hermes`], [`ToolStyle::Llama3`]) as
/// [`ReplyReader`] reads one in the JSON protocol: the words before the first `<tool_call>` as they come (holding
/// back what may be the start of the tag), or a bare call that begins the reply, then each call's name and
/// arguments. The calls are handed to a [`ReplyReader`] as the protocol's `tool_calls` list they amount to, so every
/// style reads calls the same way.
#[derive(Debug)]
pub struct NativeReader {
    syntax: CallSyntax,
    raw: String,
    /// Bytes of `raw` read so far.
    pos: usize,
    at: NativeAt,
    calls: ReplyReader,
    /// Calls whose closing tag was read.
    closed: usize,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum NativeAt {
    /// Words, before any call.
    Words,
    /// A bare call's reply before its first character: a call if it is `{`, else words.
    Start,
    /// Words in which no call can begin.
    Plain,
    /// Inside a call's object (after its opening tag).
    Call,
    /// After a call's object: its closing tag.
    Closing,
    /// After a closing tag: another call's opening tag, or the end.
    Between,
    /// Something else followed the calls: it is not read.
    Trailing,
}

impl NativeReader {
    pub fn new(syntax: CallSyntax) -> NativeReader {
        let (at, parameters) = match syntax {
            CallSyntax::Hermes => (NativeAt::Words, false),
            CallSyntax::Llama3 => (NativeAt::Start, true),
        };
        let calls = ReplyReader { parameters, ..ReplyReader::default() };
        NativeReader { syntax, raw: String::new(), pos: 0, at, calls, closed: 0 }
    }

    /// Takes the next piece of the reply and returns what it completes.
    pub fn push(&mut self, piece: &str) -> Vec<ReplyPiece> {
        self.raw.push_str(piece);
        let mut out = Vec::new();
        loop {
            let rest = &self.raw[self.pos..];
            let next = match self.at {
                NativeAt::Start => match rest.chars().next() {
                    None => None,
                    Some('{') => {
                        out.extend(self.calls.push("{\"tool_calls\": ["));
                        Some(NativeAt::Call)
                    }
                    Some(_) => Some(NativeAt::Plain),
                },
                NativeAt::Plain => {
                    if !rest.is_empty() {
                        out.push(ReplyPiece::Words(rest.to_string()));
                        self.pos = self.raw.len();
                    }
                    None
                }
                NativeAt::Words => match rest.find(OPEN) {
                    Some(i) => {
                        if i > 0 {
                            out.push(ReplyPiece::Words(rest[..i].to_string()));
                        }
                        self.pos += i + OPEN.len();
                        out.extend(self.calls.push("{\"tool_calls\": ["));
                        Some(NativeAt::Call)
                    }
                    None => {
                        // Everything but a tail that may begin the tag.
                        let keep = (1..OPEN.len().min(rest.len() + 1))
                            .rev()
                            .find(|&k| {
                                rest.is_char_boundary(rest.len() - k) && OPEN.starts_with(&rest[rest.len() - k..])
                            })
                            .unwrap_or(0);
                        let words = rest.len() - keep;
                        if words > 0 {
                            out.push(ReplyPiece::Words(rest[..words].to_string()));
                            self.pos += words;
                        }
                        None
                    }
                },
                NativeAt::Call => {
                    // A character at a time, so that the object's end is where the reader stops.
                    let mut next = None;
                    while let Some(c) = self.raw[self.pos..].chars().next() {
                        self.pos += c.len_utf8();
                        let mut buf = [0u8; 4];
                        out.extend(self.calls.push(c.encode_utf8(&mut buf)));
                        if self.calls.after_call() {
                            next = Some(match self.syntax {
                                CallSyntax::Hermes => NativeAt::Closing,
                                // A bare call is the whole reply.
                                CallSyntax::Llama3 => {
                                    self.closed += 1;
                                    NativeAt::Trailing
                                }
                            });
                            break;
                        }
                        if self.calls.is_other() {
                            next = Some(NativeAt::Trailing);
                            break;
                        }
                    }
                    next
                }
                NativeAt::Closing => match tag_after_space(rest, CLOSE) {
                    Some(Some(n)) => {
                        self.pos += n;
                        self.closed += 1;
                        Some(NativeAt::Between)
                    }
                    Some(None) => Some(NativeAt::Trailing),
                    None => None,
                },
                NativeAt::Between => match tag_after_space(rest, OPEN) {
                    Some(Some(n)) => {
                        self.pos += n;
                        out.extend(self.calls.push(","));
                        Some(NativeAt::Call)
                    }
                    Some(None) => Some(NativeAt::Trailing),
                    None => None,
                },
                NativeAt::Trailing => None,
            };
            match next {
                Some(at) => self.at = at,
                None => break,
            }
        }
        out
    }

    /// The words held back at the end of the reply (they did not begin a tag after all).
    pub fn finish(&mut self) -> Vec<ReplyPiece> {
        if self.at != NativeAt::Words || self.pos == self.raw.len() {
            return Vec::new();
        }
        let words = self.raw[self.pos..].to_string();
        self.pos = self.raw.len();
        vec![ReplyPiece::Words(words)]
    }

    /// Whether every call begun was closed, and there was one.
    pub fn is_complete(&self) -> bool {
        self.closed > 0
            && self.closed == self.calls.calls()
            && matches!(self.at, NativeAt::Between | NativeAt::Trailing)
    }
}

/// `tag` after any whitespace at the start of `text`: `Some(Some(bytes taken))`, `Some(None)` if something else
/// comes, `None` if the text ends before that is known.
fn tag_after_space(text: &str, tag: &str) -> Option<Option<usize>> {
    let space = text.len() - text.trim_start().len();
    let rest = &text[space..];
    if rest.starts_with(tag) {
        Some(Some(space + tag.len()))
    } else if tag.starts_with(rest) {
        None
    } else {
        Some(None)
    }
}

/// A reader of replies in either style ([`ToolUse::reader`]).
#[derive(Debug)]
pub enum CallReader {
    Json(ReplyReader),
    Native(NativeReader),
}

impl CallReader {
    /// Takes the next piece of the reply and returns what it completes.
    pub fn push(&mut self, piece: &str) -> Vec<ReplyPiece> {
        match self {
            CallReader::Json(r) => r.push(piece),
            CallReader::Native(r) => r.push(piece),
        }
    }

    /// Takes the reply's last piece, and gives with what it completes what the reader held back.
    pub fn push_end(&mut self, last: &str) -> Vec<ReplyPiece> {
        let mut pieces = self.push(last);
        pieces.extend(self.finish());
        pieces
    }

    /// What the reader held back, at the reply's end.
    pub fn finish(&mut self) -> Vec<ReplyPiece> {
        match self {
            CallReader::Json(_) => Vec::new(),
            CallReader::Native(r) => r.finish(),
        }
    }

    /// The reply so far, as written.
    pub fn raw(&self) -> &str {
        match self {
            CallReader::Json(r) => r.raw(),
            CallReader::Native(r) => &r.raw,
        }
    }

    /// Whether the reply made calls and was read to their end.
    pub fn is_complete(&self) -> bool {
        match self {
            CallReader::Json(r) => r.is_complete() && r.calls() > 0,
            CallReader::Native(r) => r.is_complete(),
        }
    }

    /// Whether the reply is (so far) an answer in words.
    pub fn is_response(&self) -> bool {
        match self {
            CallReader::Json(r) => r.is_response(),
            CallReader::Native(r) => {
                r.calls.calls() == 0 && matches!(r.at, NativeAt::Words | NativeAt::Start | NativeAt::Plain)
            }
        }
    }

    /// Whether the reply is not of the shapes read (nothing of it is then given as pieces): only in the JSON
    /// style, where the whole reply is one object (a tagged reply's words are words).
    pub fn is_other(&self) -> bool {
        match self {
            CallReader::Json(r) => r.is_other(),
            CallReader::Native(_) => false,
        }
    }
}

enum Escaped {
    Char(char),
    /// A `\uXXXX` UTF-16 unit.
    Unit(u16),
}

/// The escape at the start of `s` and its length in bytes; `None` if `s` ends before it does.
fn unescape(s: &str) -> Option<(Escaped, usize)> {
    let b = s.as_bytes();
    let c = match *b.get(1)? {
        b'n' => '\n',
        b't' => '\t',
        b'r' => '\r',
        b'b' => '\u{8}',
        b'f' => '\u{c}',
        b'u' => {
            let hex = s.get(2..6)?;
            return Some((Escaped::Unit(u16::from_str_radix(hex, 16).ok()?), 6));
        }
        other => char::from(other),
    };
    Some((Escaped::Char(c), 2))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn weather() -> Tool {
        Tool {
            name: "get_weather".into(),
            description: Some("The weather".into()),
            parameters: Some(
                json!({"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}),
            ),
        }
    }

    /// Every piece a reader gives for `reply` pushed in the pieces `cuts` makes, joined: (words, calls as
    /// (name, arguments)).
    fn read_in_pieces(reply: &str, cuts: &[usize]) -> (String, Vec<(String, String)>, CallReader) {
        read_with(CallReader::Json(ReplyReader::default()), reply, cuts)
    }

    /// [`read_in_pieces`] with reader `r`, which is then told the reply ended.
    fn read_with(mut r: CallReader, reply: &str, cuts: &[usize]) -> (String, Vec<(String, String)>, CallReader) {
        let (mut words, mut calls) = (String::new(), Vec::<(String, String)>::new());
        let mut from = 0;
        let ends = [reply.len(), usize::MAX];
        for &cut in cuts.iter().chain(&ends) {
            let pieces = if cut == usize::MAX { r.finish() } else { r.push(&reply[from..cut]) };
            for p in pieces {
                match p {
                    ReplyPiece::Words(w) => words.push_str(&w),
                    ReplyPiece::CallStart { index, id, name } => {
                        assert_eq!(index, calls.len());
                        assert!(id.starts_with("call_"));
                        calls.push((name, String::new()));
                    }
                    ReplyPiece::Arguments { index, text } => calls[index].1.push_str(&text),
                }
            }
            from = cut;
        }
        (words, calls, r)
    }

    /// A reply, the words read from it, and its calls (name, arguments).
    type ReadCase<'a> = (&'a str, &'a str, Vec<(String, String)>);

    /// Each `(text, words, calls)` read by a fresh reader from `reader`, whole, cut at every character boundary,
    /// and cut at all of them at once: always the same words and calls, complete when there are calls.
    fn read_across_every_split(reader: impl Fn() -> CallReader, cases: [ReadCase<'_>; 2]) {
        for (text, want_words, want_calls) in cases {
            let every: Vec<usize> = (1..text.len()).filter(|&c| text.is_char_boundary(c)).collect();
            let mut splits: Vec<Vec<usize>> = every.iter().map(|&c| vec![c]).collect();
            splits.extend([vec![], every]);
            for cuts in splits {
                let (w, c, r) = read_with(reader(), text, &cuts);
                assert_eq!((w.as_str(), &c), (want_words, &want_calls), "split at {cuts:?}");
                assert_eq!(r.is_complete(), !want_calls.is_empty(), "{cuts:?}");
                assert_eq!(r.is_response(), want_calls.is_empty(), "{cuts:?}");
            }
        }
    }

    #[test]
    fn tagged_replies_are_read_across_every_split() {
        let tagged = || CallReader::Native(NativeReader::new(CallSyntax::Hermes));
        let calls = "Let me see: <tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"<Oslo>\"}}\n</tool_call>\n\
                     <tool_call>\n{\"name\": \"get_time\", \"arguments\": {}}\n</tool_call>";
        let want = vec![
            ("get_weather".to_string(), r#"{"city":"<Oslo>"}"#.to_string()),
            ("get_time".to_string(), "{}".to_string()),
        ];
        let words = "a < b, <tool_call ends with <tool";
        read_across_every_split(tagged, [(calls, "Let me see: ", want), (words, words, vec![])]);
        // Cut short inside a call: the call as far as it goes, not complete.
        let (w, c, r) = read_with(tagged(), &calls[..60], &[]);
        assert_eq!((w.as_str(), c.len()), ("Let me see: ", 1));
        assert!(!r.is_complete() && !r.is_response());
    }

    #[test]
    fn bare_replies_are_read_across_every_split() {
        let bare = || CallReader::Native(NativeReader::new(CallSyntax::Llama3));
        let call = "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"{Oslo}\"}}";
        let want = vec![("get_weather".to_string(), r#"{"city":"{Oslo}"}"#.to_string())];
        let words = "It is {warm} in Oslo.";
        read_across_every_split(bare, [(call, "", want), (words, words, vec![])]);
        let (_, c, r) = read_with(bare(), &call[..30], &[]);
        assert!(c.len() == 1 && !r.is_complete() && !r.is_response());
    }

    #[test]
    fn the_template_decides_the_style() {
        let llama3 = include_str!("../tests/data/llama3-tools.jinja");
        assert_eq!(ToolStyle::of_template(llama3), ToolStyle::Llama3);
        let t = ToolUse::new_in(vec![weather()], ToolChoice::Required, true, ToolStyle::Llama3).unwrap().unwrap();
        let OutputFormat::NativeCalls(spec) = t.format() else { panic!("{:?}", t.format()) };
        assert!(!spec.lazy && spec.max_calls == 1, "a bare call is the whole reply");
        let reply = "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Oslo\"}}";
        let Some(ToolReply::Calls(calls)) = t.read(reply) else { panic!("{reply}") };
        assert_eq!(calls[0].arguments, r#"{"city":"Oslo"}"#);

        let tagged = include_str!("../tests/data/tagged-tools.jinja");
        assert_eq!(ToolStyle::of_template(tagged), ToolStyle::Hermes);
        for plain in [crate::tokenizer::chat::CHATML, crate::tokenizer::chat::GEMMA] {
            assert_eq!(ToolStyle::of_template(plain), ToolStyle::Json);
        }
        let t = ToolUse::new(vec![weather()], ToolChoice::Auto, true).unwrap().unwrap();
        assert!(t.template_tools().is_none() && matches!(t.format(), OutputFormat::JsonSchema(_)));
        let t = ToolUse::new_in(vec![weather()], ToolChoice::Auto, true, ToolStyle::Hermes).unwrap().unwrap();
        assert_eq!(t.style(), ToolStyle::Hermes);
        assert_eq!(t.template_tools().unwrap()[0]["function"]["name"], "get_weather");
        let OutputFormat::NativeCalls(spec) = t.format() else { panic!("{:?}", t.format()) };
        assert!(spec.lazy && usize::from(spec.max_calls) == MAX_CALLS);
        let mut messages = vec![ChatMessage::new("user", "hi")];
        t.prompt(&mut messages);
        assert_eq!(messages, [ChatMessage::new("user", "hi")], "the template lists the tools");
        let reply = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}\n</tool_call>";
        let Some(ToolReply::Calls(calls)) = t.read(reply) else { panic!("{reply}") };
        assert_eq!((calls[0].name.as_str(), calls[0].arguments.as_str()), ("get_weather", r#"{"city":"Oslo"}"#));
        assert_eq!(t.read("It is sunny."), Some(ToolReply::Text("It is sunny.".into())));
        assert_eq!(t.read("<tool_call>\n{\"name\""), None);
        let named =
            ToolUse::new_in(vec![weather()], ToolChoice::Function("get_weather".into()), false, ToolStyle::Hermes);
        let named = named.unwrap().unwrap();
        let OutputFormat::NativeCalls(spec) = named.format() else { panic!() };
        assert!(!spec.lazy && spec.max_calls == 1);
    }

    #[test]
    fn replies_are_read_across_every_split() {
        let reply = " { \"response\" : \"a\\\"b\\\\c\\n\\u00e9\\ud83d\\ude00 é end\" }";
        let want = "a\"b\\c\né😀 é end";
        let calls = "{\n \"tool_calls\" : [ {\"name\": \"get_weather\", \"arguments\" : {\"city\": \"Oslo \\\" N\", \
                     \"days\": [1, {\"a\": []}]}} ,\n{ \"name\":\"t\",\"arguments\":{}}]}";
        let want_calls = vec![
            ("get_weather".to_string(), r#"{"city":"Oslo \" N","days":[1,{"a":[]}]}"#.to_string()),
            ("t".to_string(), "{}".to_string()),
        ];
        for (text, words, list) in [(reply, want, vec![]), (calls, "", want_calls)] {
            let whole = read_in_pieces(text, &[]);
            assert_eq!((whole.0.as_str(), &whole.1), (words, &list));
            for cut in (1..text.len()).filter(|&c| text.is_char_boundary(c)) {
                let (w, c, r) = read_in_pieces(text, &[cut]);
                assert_eq!((w.as_str(), &c), (words, &list), "split at {cut}");
                assert_eq!(r.is_response(), list.is_empty());
            }
            let every: Vec<usize> = (1..text.len()).filter(|&c| text.is_char_boundary(c)).collect();
            let (w, c, _) = read_in_pieces(text, &every);
            assert_eq!((w.as_str(), &c), (words, &list), "char by char");
        }
        for other in ["[", r#"{"responses": "x"}"#, r#"{"response": 1}"#] {
            let (w, c, r) = read_in_pieces(other, &[]);
            assert!(w.is_empty() && c.is_empty() && !r.is_response() && r.is_other(), "{other}");
        }
    }

    #[test]
    fn replies_read_back_into_calls_or_words() {
        let t = ToolUse::new(vec![weather()], ToolChoice::Auto, true).unwrap().unwrap();
        let calls = t.read("{\"tool_calls\": [{\"name\": \"get_weather\", \"arguments\": {\"city\" : \"Oslo Nord\", \"n\": 123456789012345678901234567890}}]}");
        let Some(ToolReply::Calls(calls)) = calls else { panic!("{calls:?}") };
        assert_eq!(calls[0].name, "get_weather");
        assert_eq!(calls[0].arguments, r#"{"city":"Oslo Nord","n":123456789012345678901234567890}"#);
        assert!(calls[0].id.starts_with("call_") && calls[0].id.len() == 29);
        assert_eq!(t.read(r#"{"response": "hi"}"#), Some(ToolReply::Text("hi".into())));
        assert_eq!(t.read(r#"{"response": "hi"#), None);
    }

    #[test]
    fn the_choice_shapes_the_schema_and_the_instruction() {
        let time = Tool { name: "get_time".into(), description: None, parameters: None };
        let auto = ToolUse::new(vec![weather(), time.clone()], ToolChoice::Auto, true).unwrap().unwrap();
        assert!(auto.instruction().contains("{\"response\""));
        assert!(auto.instruction().contains(
            r#"{"name":"get_time","parameters":{"type":"object","properties":{},"additionalProperties":false}}"#
        ));
        let named = ToolUse::new(vec![weather(), time.clone()], ToolChoice::Function("get_time".into()), false);
        let named = named.unwrap().unwrap();
        assert!(!named.instruction().contains("{\"response\""));
        assert!(
            named.instruction().contains("call the tool \"get_time\"") && named.instruction().contains("exactly one")
        );
        let OutputFormat::JsonSchema(s) = named.format() else { panic!("{:?}", named.format()) };
        assert!(s.source()["properties"]["tool_calls"]["items"]["anyOf"].as_array().unwrap().len() == 1);
        assert_eq!(s.source()["properties"]["tool_calls"]["maxItems"], json!(1));
        assert!(ToolUse::new(vec![weather()], ToolChoice::None, true).unwrap().is_none());
        assert!(ToolUse::new(vec![], ToolChoice::Auto, true).unwrap().is_none());
        assert_eq!(
            ToolUse::new(vec![], ToolChoice::Required, true).unwrap_err(),
            ToolError::NoTools { choice: "\"required\"" }
        );
    }

    #[test]
    fn references_move_with_the_schema() {
        let s = json!({"$defs": {"A": {"type": "string"}}, "type": "object",
                       "properties": {"a": {"$ref": "#/$defs/A"}, "b": {"$ref": "#"}, "c": {"$ref": "other.json"}}});
        let moved = rebase_refs(s, "/$defs/tool3");
        assert_eq!(moved["properties"]["a"]["$ref"], "#/$defs/tool3/$defs/A");
        assert_eq!(moved["properties"]["b"]["$ref"], "#/$defs/tool3");
        assert_eq!(moved["properties"]["c"]["$ref"], "other.json");
    }

    #[test]
    fn whitespace_between_tokens_goes_and_strings_keep_theirs() {
        let t = ToolUse::new(vec![weather()], ToolChoice::Auto, true).unwrap().unwrap();
        let reply = "{\"tool_calls\": [{\"name\": \"w\", \"arguments\": { \"a b\" :\t[1 ,\n \"x \\\" y\" ] }}]}";
        let Some(ToolReply::Calls(calls)) = t.read(reply) else { panic!("{reply}") };
        assert_eq!(calls[0].arguments, r#"{"a b":[1,"x \" y"]}"#);
    }
}
