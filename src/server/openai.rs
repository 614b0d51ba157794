//! The OpenAI-compatible request bodies: parsed from JSON by hand, so that every wrong type or bad value gets a 400
//! naming the field, and responses in the shapes the official clients expect.
//!
//! Fields a client may send that do not change the result (`user`, `stream_options` without usage, a `model` name)
//! are accepted; unknown fields are ignored, as the OpenAI API does; features this server does not have (`echo`,
//! `best_of` on chat, the legacy `functions`, a JSON schema keyword the output cannot be held to, ...) are refused by name rather
//! than silently dropped.

use std::sync::Arc;

use serde_json::{Map, Value, json};

use crate::engine::{FinishReason, Usage};
use crate::sampling::{
    BIAS_LIMIT, DryParams, DynatempParams, LogitBias, MirostatParams, SamplerOrder, SamplingError, SamplingParams,
    XtcParams, random_seed,
};
use crate::structured::schema::json_kind as kind;
use crate::structured::{Grammar, JsonSchema, OutputFormat};
use crate::tokenizer::chat::ChatMessage;
use crate::tools::{PastCall, Tool, ToolCall, ToolChoice, ToolError, ToolResult, ToolStyle, ToolUse};

/// A client error: HTTP status, message, and the parameter at fault.
#[derive(Debug, Clone, PartialEq)]
pub struct ApiError {
    pub status: u16,
    pub message: String,
    pub param: Option<String>,
    pub code: Option<&'static str>,
}

impl ApiError {
    pub fn bad(param: &str, message: impl Into<String>) -> ApiError {
        ApiError { status: 400, message: message.into(), param: Some(param.to_string()), code: None }
    }

    pub fn new(status: u16, message: impl Into<String>) -> ApiError {
        ApiError { status, message: message.into(), param: None, code: None }
    }

    /// The OpenAI error body.
    pub fn body(&self) -> Value {
        let kind = match self.status {
            401 | 403 => "authentication_error",
            404 => "not_found_error",
            429 => "rate_limit_error",
            500..=599 => "server_error",
            _ => "invalid_request_error",
        };
        json!({ "error": { "message": self.message, "type": kind, "param": self.param, "code": self.code } })
    }
}

/// What to generate from: text (a completion prompt) or a conversation.
#[derive(Debug, Clone, PartialEq)]
pub enum Prompt {
    Text(String),
    Tokens(Vec<u32>),
    Chat(Vec<ChatMessage>),
}

/// A parsed `/v1/completions` or `/v1/chat/completions` request.
#[derive(Debug, Clone, PartialEq)]
pub struct GenerationRequest {
    pub prompt: Prompt,
    /// `None`: until the context is full (chat) — completions default to 16, as OpenAI's do.
    pub max_tokens: Option<usize>,
    pub sampling: SamplingParams,
    pub stop: Vec<String>,
    pub stream: bool,
    /// `stream_options.include_usage`: a last chunk with the usage and no choices.
    pub include_usage: bool,
    pub ignore_eos: bool,
    pub model: Option<String>,
    /// `response_format`: free text, one JSON object, or one value of a JSON schema.
    pub format: OutputFormat,
    /// Report each token's log-probability and this many alternatives (`None`: no logprobs).
    pub logprobs: Option<usize>,
    /// `logit_bias`: added to the named tokens' logits.
    pub logit_bias: LogitBias,
    /// `dry_sequence_breakers` (llama-server's field); `None`: DRY's defaults.
    pub dry_breakers: Option<Vec<String>>,
    /// `n`: how many choices to return.
    pub n: usize,
    /// `best_of` (completions): how many to generate, of which the `n` with the highest mean log-probability per
    /// token are returned; at least `n`.
    pub best_of: usize,
    /// `tools` with a `tool_choice` that allows calls: the conversation already describes them and `format` holds
    /// the reply to their schema; the reply is read back into calls.
    pub tools: Option<Arc<ToolUse>>,
}

/// Most choices one request may ask for (OpenAI's limit); the server's `--parallel` bounds it further.
pub const MAX_CHOICES: usize = 128;

/// Most stop strings a request may give.
pub const MAX_STOPS: usize = 16;

/// Typed access to a JSON object's fields, with errors that name the field.
struct Fields<'a>(&'a Map<String, Value>);

impl Fields<'_> {
    /// The field, with `null` treated as absent.
    fn get(&self, name: &str) -> Option<&Value> {
        self.0.get(name).filter(|v| !v.is_null())
    }

    fn f32(&self, name: &str) -> Result<Option<f32>, ApiError> {
        match self.get(name) {
            None => Ok(None),
            Some(Value::Number(n)) => match n.as_f64() {
                Some(x) if x.is_finite() => Ok(Some(x as f32)),
                _ => Err(ApiError::bad(name, format!("`{name}` must be a finite number"))),
            },
            Some(v) => Err(ApiError::bad(name, format!("`{name}` must be a number, not {}", kind(v)))),
        }
    }

    fn int(&self, name: &str) -> Result<Option<i64>, ApiError> {
        match self.get(name) {
            None => Ok(None),
            Some(Value::Number(n)) => match (n.as_i64(), n.as_u64(), n.as_f64()) {
                (Some(i), _, _) => Ok(Some(i)),
                (None, Some(u), _) => Ok(Some(i64::try_from(u).unwrap_or(i64::MAX))),
                (_, _, Some(f)) if f.fract() == 0.0 && f.abs() < 9e15 => Ok(Some(f as i64)),
                _ => Err(ApiError::bad(name, format!("`{name}` must be an integer"))),
            },
            Some(v) => Err(ApiError::bad(name, format!("`{name}` must be an integer, not {}", kind(v)))),
        }
    }

    /// A string or an array of strings (`stop`, `dry_sequence_breakers`).
    fn strings(&self, name: &str) -> Result<Option<Vec<String>>, ApiError> {
        match self.get(name) {
            None => Ok(None),
            Some(Value::String(s)) => Ok(Some(vec![s.clone()])),
            Some(Value::Array(items)) => items
                .iter()
                .map(|item| match item {
                    Value::String(s) => Ok(s.clone()),
                    v => Err(ApiError::bad(name, format!("`{name}` entries must be strings, not {}", kind(v)))),
                })
                .collect::<Result<Vec<_>, _>>()
                .map(Some),
            Some(v) => {
                Err(ApiError::bad(name, format!("`{name}` must be a string or an array of strings, not {}", kind(v))))
            }
        }
    }

    fn bool(&self, name: &str) -> Result<Option<bool>, ApiError> {
        match self.get(name) {
            None => Ok(None),
            Some(Value::Bool(b)) => Ok(Some(*b)),
            Some(v) => Err(ApiError::bad(name, format!("`{name}` must be true or false, not {}", kind(v)))),
        }
    }

    fn string(&self, name: &str) -> Result<Option<&str>, ApiError> {
        match self.get(name) {
            None => Ok(None),
            Some(Value::String(s)) => Ok(Some(s)),
            Some(v) => Err(ApiError::bad(name, format!("`{name}` must be a string, not {}", kind(v)))),
        }
    }

    /// Refuses a feature by name unless the field is absent or has its neutral value.
    fn unsupported(&self, name: &str, neutral: impl Fn(&Value) -> bool, what: &str) -> Result<(), ApiError> {
        match self.get(name) {
            Some(v) if !neutral(v) => Err(ApiError::bad(name, format!("`{name}`: {what} is not supported"))),
            _ => Ok(()),
        }
    }
}

/// Parses a request body. `chat` selects the chat endpoint's fields.
pub fn parse(body: &[u8], chat: bool) -> Result<GenerationRequest, ApiError> {
    parse_in(body, chat, ToolStyle::Json)
}

/// [`parse`] for a chat template whose tool style is `style`: the tools, earlier calls and their results are
/// prepared as that style has them.
pub fn parse_in(body: &[u8], chat: bool, style: ToolStyle) -> Result<GenerationRequest, ApiError> {
    let value: Value = serde_json::from_slice(body)
        .map_err(|e| ApiError::new(400, format!("the request body is not valid JSON: {e}")))?;
    let Value::Object(map) = &value else {
        return Err(ApiError::new(400, format!("the request body must be a JSON object, not {}", kind(&value))));
    };
    let f = Fields(map);

    let mut prompt = if chat { Prompt::Chat(parse_messages(&f, style)?) } else { parse_prompt(&f)? };

    let max_tokens_field =
        if chat && f.get("max_completion_tokens").is_some() { "max_completion_tokens" } else { "max_tokens" };
    let max_tokens = match f.int(max_tokens_field)? {
        None => None,
        Some(n) if n >= 1 => Some(usize::try_from(n).unwrap_or(usize::MAX)),
        // llama.cpp's -1: until the context is full.
        Some(-1) => None,
        Some(n) => {
            return Err(ApiError::bad(max_tokens_field, format!("`{max_tokens_field}` must be at least 1, got {n}")));
        }
    };

    let d = SamplingParams::DEFAULT;
    let temperature = f.f32("temperature")?.unwrap_or(d.temperature);
    if temperature < 0.0 {
        return Err(ApiError::bad("temperature", format!("`temperature` must be >= 0, got {temperature}")));
    }
    let top_p = f.f32("top_p")?.unwrap_or(d.top_p);
    if !(top_p > 0.0 && top_p <= 1.0) {
        return Err(ApiError::bad("top_p", format!("`top_p` must be in (0, 1], got {top_p}")));
    }
    let min_p = f.f32("min_p")?.unwrap_or(d.min_p);
    if !(0.0..=1.0).contains(&min_p) {
        return Err(ApiError::bad("min_p", format!("`min_p` must be in [0, 1], got {min_p}")));
    }
    let top_k = match f.int("top_k")? {
        None => d.top_k,
        // vLLM's -1 and OpenAI-style 0 both mean off.
        Some(-1) | Some(0) => 0,
        Some(k) if k > 0 => usize::try_from(k).unwrap_or(usize::MAX),
        Some(k) => return Err(ApiError::bad("top_k", format!("`top_k` must be >= 0 (or -1 for off), got {k}"))),
    };
    let penalty_field = if f.get("repetition_penalty").is_some() { "repetition_penalty" } else { "repeat_penalty" };
    let repeat_penalty = f.f32(penalty_field)?.unwrap_or(d.repeat_penalty);
    if repeat_penalty <= 0.0 {
        return Err(ApiError::bad(penalty_field, format!("`{penalty_field}` must be > 0, got {repeat_penalty}")));
    }
    let seed = match f.int("seed")? {
        None => random_seed(),
        Some(s) => s as u64,
    };
    let repeat_last_n = match f.int("repeat_last_n")? {
        None => d.repeat_last_n,
        // llama-server's -1: the whole history.
        Some(-1) => usize::MAX,
        Some(n) if n >= 0 => usize::try_from(n).unwrap_or(usize::MAX),
        Some(n) => {
            return Err(ApiError::bad("repeat_last_n", format!("`repeat_last_n` must be >= 0 (or -1: all), got {n}")));
        }
    };
    let mut penalties = [0.0f32; 2];
    for (name, value) in ["presence_penalty", "frequency_penalty"].into_iter().zip(&mut penalties) {
        let limit = crate::sampling::PENALTY_LIMIT;
        *value = f.f32(name)?.unwrap_or(0.0);
        if !(-limit..=limit).contains(value) {
            return Err(ApiError::bad(name, format!("`{name}` must be in [-{limit}, {limit}], got {value}")));
        }
    }
    let [presence_penalty, frequency_penalty] = penalties;
    let dry = DryParams {
        multiplier: f.f32("dry_multiplier")?.unwrap_or(d.dry.multiplier),
        base: f.f32("dry_base")?.unwrap_or(d.dry.base),
        allowed_length: match f.int("dry_allowed_length")? {
            None => d.dry.allowed_length,
            Some(n) => usize::try_from(n).map_err(|_| {
                ApiError::bad("dry_allowed_length", format!("`dry_allowed_length` must be >= 0, got {n}"))
            })?,
        },
        penalty_last_n: f.int("dry_penalty_last_n")?.unwrap_or(d.dry.penalty_last_n),
    };
    let xtc = XtcParams {
        probability: f.f32("xtc_probability")?.unwrap_or(d.xtc.probability),
        threshold: f.f32("xtc_threshold")?.unwrap_or(d.xtc.threshold),
    };
    let dynatemp = DynatempParams {
        range: f.f32("dynatemp_range")?.unwrap_or(d.dynatemp.range),
        exponent: f.f32("dynatemp_exponent")?.unwrap_or(d.dynatemp.exponent),
    };
    let mirostat = MirostatParams {
        version: match f.int("mirostat")? {
            None => d.mirostat.version,
            Some(v @ 0..=2) => v as u8,
            Some(v) => return Err(ApiError::bad("mirostat", format!("`mirostat` must be 0 (off), 1 or 2, got {v}"))),
        },
        tau: f.f32("mirostat_tau")?.unwrap_or(d.mirostat.tau),
        eta: f.f32("mirostat_eta")?.unwrap_or(d.mirostat.eta),
    };
    let sampling = SamplingParams {
        temperature,
        top_k,
        top_p,
        min_p,
        top_n_sigma: f.f32("top_n_sigma")?.unwrap_or(d.top_n_sigma),
        repeat_penalty,
        repeat_last_n,
        presence_penalty,
        frequency_penalty,
        dry,
        xtc,
        typical_p: f.f32("typical_p")?.unwrap_or(d.typical_p),
        dynatemp,
        mirostat,
        seed,
        samplers: parse_samplers(&f)?,
    };
    // The fields checked above have their own messages; this catches the others' ranges, naming the field.
    sampling.validate().map_err(|e| match e {
        SamplingError::InvalidParam { name, .. } => ApiError::bad(name, e.to_string()),
        e => ApiError::new(400, e.to_string()),
    })?;
    let dry_breakers = f.strings("dry_sequence_breakers")?;
    if let Some(b) = &dry_breakers {
        crate::sampling::dry::check_breakers(b).map_err(|e| ApiError::bad("dry_sequence_breakers", e))?;
    }

    let stop = f.strings("stop")?.unwrap_or_default();
    if stop.len() > MAX_STOPS {
        return Err(ApiError::bad("stop", format!("at most {MAX_STOPS} stop strings, got {}", stop.len())));
    }
    if stop.iter().any(String::is_empty) {
        return Err(ApiError::bad("stop", "stop strings must not be empty"));
    }

    let n = match f.int("n")? {
        None => 1,
        Some(n) if (1..=MAX_CHOICES as i64).contains(&n) => n as usize,
        Some(n) => return Err(ApiError::bad("n", format!("`n` = {n}: expected 1 to {MAX_CHOICES} choices"))),
    };
    let best_of = match f.int("best_of")? {
        None => n,
        // The legacy completions field; chat has none (an equal value asks for nothing more).
        Some(b) if chat && b != n as i64 => {
            return Err(ApiError::bad("best_of", "`best_of` is a completions field; chat takes `n` only"));
        }
        Some(b) if (n as i64..=MAX_CHOICES as i64).contains(&b) => b as usize,
        Some(b) => {
            return Err(ApiError::bad("best_of", format!("`best_of` = {b}: expected `n` ({n}) to {MAX_CHOICES}")));
        }
    };
    f.unsupported("echo", |v| v == &Value::Bool(false), "echo")?;
    f.unsupported("suffix", |v| v.as_str() == Some(""), "suffix")?;
    let logprobs = parse_logprobs(&f, chat)?;
    let logit_bias = parse_logit_bias(&f)?;
    f.unsupported("functions", |v| v.as_array().is_some_and(Vec::is_empty), "the legacy `functions` (use `tools`)")?;
    f.unsupported("function_call", |_| false, "the legacy `function_call` (use `tool_choice`)")?;
    let mut format = parse_response_format(&f)?;
    let tools = parse_tools(&f, chat, style)?;
    if let Some(t) = &tools {
        if format != OutputFormat::Text {
            let field = if f.get("grammar").is_some() { "grammar" } else { "response_format" };
            return Err(ApiError::bad(
                field,
                format!("`{field}` cannot be combined with `tools`: tool calls have their own format"),
            ));
        }
        format = t.format();
        if let Prompt::Chat(messages) = &mut prompt {
            t.prompt(messages);
        }
    }
    let stream = f.bool("stream")?.unwrap_or(false);
    if stream && best_of > n {
        // As OpenAI: the best are known only once all have finished.
        return Err(ApiError::bad("best_of", "`best_of` above `n` cannot be streamed: the best are known at the end"));
    }
    let include_usage = match f.get("stream_options") {
        None => false,
        Some(Value::Object(o)) => Fields(o).bool("include_usage")?.unwrap_or(false),
        Some(v) => {
            return Err(ApiError::bad(
                "stream_options",
                format!("`stream_options` must be an object, not {}", kind(v)),
            ));
        }
    };
    let ignore_eos = f.bool("ignore_eos")?.unwrap_or(false);
    let model = f.string("model")?.map(str::to_string);
    f.string("user")?;
    Ok(GenerationRequest {
        prompt,
        max_tokens,
        sampling,
        stop,
        stream,
        include_usage,
        ignore_eos,
        model,
        format,
        logprobs,
        logit_bias,
        dry_breakers,
        n,
        best_of,
        tools,
    })
}

/// `tools`, `tool_choice` and `parallel_tool_calls` (chat only): `None` when no call is possible.
fn parse_tools(f: &Fields<'_>, chat: bool, style: ToolStyle) -> Result<Option<Arc<ToolUse>>, ApiError> {
    let list = match f.get("tools") {
        None => &Vec::new(),
        Some(Value::Array(items)) => items,
        Some(v) => return Err(ApiError::bad("tools", format!("`tools` must be an array, not {}", kind(v)))),
    };
    if !chat {
        if !list.is_empty() || f.get("tool_choice").is_some() {
            let field = if list.is_empty() { "tool_choice" } else { "tools" };
            return Err(ApiError::bad(field, format!("`{field}` is a chat field: use /v1/chat/completions")));
        }
        return Ok(None);
    }
    let mut tools = Vec::with_capacity(list.len());
    for (i, item) in list.iter().enumerate() {
        let param = format!("tools[{i}]");
        let bad = |what: String| ApiError::bad(&param, what);
        let Value::Object(o) = item else {
            return Err(bad(format!("`{param}` must be an object, not {}", kind(item))));
        };
        match o.get("type") {
            Some(Value::String(t)) if t == "function" => {}
            Some(Value::String(t)) => {
                return Err(bad(format!("`{param}.type` = \"{t}\": only \"function\" tools are supported")));
            }
            _ => return Err(bad(format!("`{param}.type` must be \"function\""))),
        }
        let Some(Value::Object(func)) = o.get("function") else {
            return Err(bad(format!("`{param}.function` must be an object with a `name`")));
        };
        let func = Fields(func);
        let field = |name: &str| format!("{param}.function.{name}");
        let name = match func.get("name") {
            Some(Value::String(n)) => n.clone(),
            _ => return Err(bad(format!("`{}` must be a string", field("name")))),
        };
        let description = match func.get("description") {
            None => None,
            Some(Value::String(d)) => Some(d.clone()),
            Some(v) => return Err(bad(format!("`{}` must be a string, not {}", field("description"), kind(v)))),
        };
        let parameters = match func.get("parameters") {
            None => None,
            Some(v @ Value::Object(_)) => Some(v.clone()),
            Some(v) => {
                return Err(bad(format!("`{}` must be a JSON schema object, not {}", field("parameters"), kind(v))));
            }
        };
        func.bool("strict").map_err(|_| bad(format!("`{}` must be true or false", field("strict"))))?;
        tools.push(Tool { name, description, parameters });
    }
    let choice = match f.get("tool_choice") {
        None => ToolChoice::Auto,
        Some(Value::String(c)) => match c.as_str() {
            "none" => ToolChoice::None,
            "auto" => ToolChoice::Auto,
            "required" => ToolChoice::Required,
            other => {
                return Err(ApiError::bad(
                    "tool_choice",
                    format!("`tool_choice` = \"{other}\": expected \"none\", \"auto\", \"required\" or a function"),
                ));
            }
        },
        Some(Value::Object(o)) => match o.get("function").and_then(|f| f.get("name")).and_then(Value::as_str) {
            Some(name) if o.get("type").and_then(Value::as_str) == Some("function") => {
                ToolChoice::Function(name.to_string())
            }
            _ => {
                return Err(ApiError::bad(
                    "tool_choice",
                    "a `tool_choice` object is {\"type\": \"function\", \"function\": {\"name\": ...}}",
                ));
            }
        },
        Some(v) => {
            return Err(ApiError::bad(
                "tool_choice",
                format!("`tool_choice` must be a string or an object, not {}", kind(v)),
            ));
        }
    };
    let parallel = f.bool("parallel_tool_calls")?.unwrap_or(true);
    let param = |e: &ToolError| match e {
        ToolError::BadName { index, .. }
        | ToolError::Duplicate { second: index, .. }
        | ToolError::Parameters { index, .. } => {
            format!("tools[{index}]")
        }
        ToolError::UnknownChoice { .. } | ToolError::NoTools { .. } => "tool_choice".into(),
        _ => "tools".into(),
    };
    let tools = ToolUse::new_in(tools, choice, parallel, style);
    tools.map(|t| t.map(Arc::new)).map_err(|e| ApiError::bad(&param(&e), e.to_string()))
}

/// `logit_bias`: OpenAI's object of token ids (as strings) to biases in [-100, 100], or llama-server's array of
/// `[id, bias]` pairs where a bias of `false` bans the token. Whether the ids exist in the vocabulary is the
/// engine's check (a 400 naming the id).
fn parse_logit_bias(f: &Fields<'_>) -> Result<LogitBias, ApiError> {
    let bad = |m: String| ApiError::bad("logit_bias", m);
    let entry = |id: u32, v: &Value| -> Result<(u32, f32), ApiError> {
        match v {
            Value::Bool(false) => Ok((id, f32::NEG_INFINITY)),
            Value::Number(n) => match n.as_f64() {
                Some(b) if (-f64::from(BIAS_LIMIT)..=f64::from(BIAS_LIMIT)).contains(&b) => Ok((id, b as f32)),
                _ => Err(bad(format!("the bias for token {id} must be in [-{BIAS_LIMIT}, {BIAS_LIMIT}], got {n}"))),
            },
            v => Err(bad(format!("the bias for token {id} must be a number (or false to ban it), not {}", kind(v)))),
        }
    };
    let id_of = |key: &str| key.trim().parse::<u32>().map_err(|_| bad(format!("'{key}' is not a token id")));
    let entries = match f.get("logit_bias") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Object(map)) => map.iter().map(|(k, v)| entry(id_of(k)?, v)).collect::<Result<_, _>>()?,
        Some(Value::Array(pairs)) => pairs
            .iter()
            .map(|p| match p.as_array().map(Vec::as_slice) {
                Some([Value::Number(id), v]) => entry(id_of(&id.to_string())?, v),
                _ => Err(bad(format!("each entry of the array form must be [token id, bias], not {p}"))),
            })
            .collect::<Result<_, _>>()?,
        Some(v) => return Err(bad(format!("`logit_bias` must be an object of token ids to biases, not {}", kind(v)))),
    };
    LogitBias::new(entries).map_err(|e| bad(e.to_string()))
}

/// Most alternatives the completions endpoint's `logprobs` may ask for (OpenAI's limit there).
pub const MAX_COMPLETION_LOGPROBS: i64 = 5;

/// Chat: `logprobs` (true/false) and `top_logprobs` (0 to 20, only with `logprobs`). Completions: `logprobs`, the
/// number of alternatives (0 to 5), or null.
fn parse_logprobs(f: &Fields<'_>, chat: bool) -> Result<Option<usize>, ApiError> {
    let max_top = crate::engine::MAX_TOP_LOGPROBS as i64;
    if chat {
        let on = f.bool("logprobs")?.unwrap_or(false);
        match f.int("top_logprobs")? {
            None => Ok(on.then_some(0)),
            Some(n) if !(0..=max_top).contains(&n) => {
                Err(ApiError::bad("top_logprobs", format!("`top_logprobs` must be in 0..={max_top}, got {n}")))
            }
            Some(n) if n > 0 && !on => Err(ApiError::bad("top_logprobs", "`top_logprobs` needs `logprobs`: true")),
            Some(n) => Ok(on.then_some(n as usize)),
        }
    } else {
        f.unsupported(
            "top_logprobs",
            |v| v.as_i64() == Some(0),
            "top_logprobs on /v1/completions (use `logprobs`: N)",
        )?;
        match f.int("logprobs")? {
            None => Ok(None),
            Some(n) if (0..=MAX_COMPLETION_LOGPROBS).contains(&n) => Ok(Some(n as usize)),
            Some(n) => Err(ApiError::bad(
                "logprobs",
                format!("`logprobs` must be in 0..={MAX_COMPLETION_LOGPROBS} on /v1/completions, got {n}"),
            )),
        }
    }
}

/// One generated token's log-probability and its most likely alternatives, with their text.
#[derive(Debug, Clone)]
pub struct TokenLogprobs {
    pub bytes: Vec<u8>,
    pub logprob: f32,
    pub top: Vec<(Vec<u8>, f32)>,
}

/// A token's text for `logprobs`: its bytes, with a piece of a UTF-8 character shown as U+FFFD (the `bytes` field
/// has them exactly).
fn token_text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// A logprob as JSON: a number, or (if the model's output was not finite) null.
fn lp(x: f32) -> Value {
    if x.is_finite() { json!(x) } else { Value::Null }
}

/// The `logprobs` object of a choice, for the tokens in `entries`. Chat: `{"content": [{token, logprob, bytes,
/// top_logprobs}]}`. Completions (the legacy shape): `{"tokens", "token_logprobs", "top_logprobs", "text_offset"}`,
/// the offsets counted in bytes from `offset`, where these tokens begin in the completion.
pub fn logprobs_json(chat: bool, entries: &[TokenLogprobs], offset: usize) -> Value {
    if chat {
        let content: Vec<Value> = entries
            .iter()
            .map(|e| {
                let top: Vec<Value> = e
                    .top
                    .iter()
                    .map(|(b, x)| json!({ "token": token_text(b), "logprob": lp(*x), "bytes": b }))
                    .collect();
                json!({ "token": token_text(&e.bytes), "logprob": lp(e.logprob), "bytes": e.bytes, "top_logprobs": top })
            })
            .collect();
        return json!({ "content": content });
    }
    let mut at = offset;
    let mut offsets = Vec::with_capacity(entries.len());
    for e in entries {
        offsets.push(at);
        at += e.bytes.len();
    }
    json!({
        "tokens": entries.iter().map(|e| token_text(&e.bytes)).collect::<Vec<_>>(),
        "token_logprobs": entries.iter().map(|e| lp(e.logprob)).collect::<Vec<_>>(),
        "top_logprobs": entries
            .iter()
            .map(|e| e.top.iter().map(|(b, x)| (token_text(b), lp(*x))).collect::<Map<String, Value>>())
            .collect::<Vec<_>>(),
        "text_offset": offsets,
    })
}

/// llama-server's `samplers`: the sampling steps in order, as a list of names (`["top_k", "temperature"]`) or one
/// string of them separated by `;`.
fn parse_samplers(f: &Fields<'_>) -> Result<SamplerOrder, ApiError> {
    const NAME: &str = "samplers";
    let bad = |e: String| ApiError::bad(NAME, format!("`{NAME}`: {e}"));
    match f.get(NAME) {
        None | Some(Value::Null) => Ok(SamplerOrder::DEFAULT),
        Some(Value::String(s)) => SamplerOrder::parse(s).map_err(bad),
        Some(Value::Array(items)) => {
            let mut names = Vec::with_capacity(items.len());
            for item in items {
                match item {
                    Value::String(s) if !s.contains([';', ',']) => names.push(s.as_str()),
                    Value::String(s) => return Err(bad(format!("`{s}` is not one sampler name"))),
                    v => return Err(bad(format!("expected sampler names, found {}", kind(v)))),
                }
            }
            SamplerOrder::parse(&names.join(";")).map_err(bad)
        }
        Some(v) => Err(bad(format!("expected a list of sampler names or a string, not {}", kind(v)))),
    }
}

/// `response_format`: `{"type": "text"}` (the default), `{"type": "json_object"}`, or OpenAI's
/// `{"type": "json_schema", "json_schema": {"name": ..., "schema": {...}}}`; llama-server's spellings too, a `schema`
/// beside `json_object` and a top-level `json_schema` field. A schema the structured output cannot enforce is a 400
/// naming the keyword, never a looser constraint.
///
/// llama-server's `grammar` field (GBNF text) constrains the text to the grammar instead; it cannot be combined
/// with a JSON format, and a grammar that does not compile is a 400 naming the line and column.
fn parse_response_format(f: &Fields<'_>) -> Result<OutputFormat, ApiError> {
    const NAME: &str = "response_format";
    match f.get("grammar") {
        None | Some(Value::Null) => {}
        Some(Value::String(g)) if g.trim().is_empty() => {}
        Some(Value::String(g)) => {
            if f.get(NAME).is_some() || f.get("json_schema").is_some() {
                return Err(ApiError::bad("grammar", "give either `grammar` or a JSON `response_format`, not both"));
            }
            return Grammar::parse(g)
                .map(|g| OutputFormat::Grammar(Arc::new(g)))
                .map_err(|e| ApiError::bad("grammar", format!("`grammar`: {e}")));
        }
        Some(v) => return Err(ApiError::bad("grammar", format!("`grammar` must be GBNF text, not {}", kind(v)))),
    }
    let schema = |v: &Value, field: &str| {
        JsonSchema::compile(v)
            .map(|s| OutputFormat::JsonSchema(Arc::new(s)))
            .map_err(|e| ApiError::bad(NAME, format!("`{field}`: {e}")))
    };
    let o = match (f.get(NAME), f.get("json_schema")) {
        (None, None) => return Ok(OutputFormat::Text),
        (None, Some(v)) => {
            return schema(v, "json_schema").map_err(|e| ApiError { param: Some("json_schema".into()), ..e });
        }
        (Some(_), Some(_)) => {
            return Err(ApiError::bad(NAME, "give either `response_format` or `json_schema`, not both"));
        }
        (Some(Value::Object(o)), None) => o,
        (Some(v), None) => return Err(ApiError::bad(NAME, format!("`{NAME}` must be an object, not {}", kind(v)))),
    };
    match o.get("type") {
        Some(Value::String(t)) if t == "text" => Ok(OutputFormat::Text),
        Some(Value::String(t)) if t == "json_object" => match o.get("schema") {
            None | Some(Value::Null) => Ok(OutputFormat::JsonObject),
            Some(v) => schema(v, "response_format.schema"),
        },
        Some(Value::String(t)) if t == "json_schema" => match o.get("json_schema") {
            Some(Value::Object(js)) => match js.get("schema") {
                // OpenAI makes the schema optional; without one the output is a JSON object.
                None | Some(Value::Null) => Ok(OutputFormat::JsonObject),
                Some(v) => schema(v, "response_format.json_schema.schema"),
            },
            Some(v) => Err(ApiError::bad(
                NAME,
                format!("`response_format.json_schema` must be an object with a `schema`, not {}", kind(v)),
            )),
            None => Err(ApiError::bad(NAME, "`response_format` of type json_schema needs a `json_schema` object")),
        },
        Some(Value::String(t)) => Err(ApiError::bad(
            NAME,
            format!("`response_format.type` = \"{t}\": expected \"text\", \"json_object\" or \"json_schema\""),
        )),
        Some(v) => Err(ApiError::bad(NAME, format!("`response_format.type` must be a string, not {}", kind(v)))),
        None => {
            Err(ApiError::bad(NAME, "`response_format` needs a `type` (\"text\", \"json_object\" or \"json_schema\")"))
        }
    }
}

fn parse_prompt(f: &Fields<'_>) -> Result<Prompt, ApiError> {
    let tokens = |items: &[Value]| -> Result<Vec<u32>, ApiError> {
        items
            .iter()
            .map(|v| {
                v.as_u64()
                    .and_then(|t| u32::try_from(t).ok())
                    .ok_or_else(|| ApiError::bad("prompt", "a token-id prompt must hold whole numbers >= 0"))
            })
            .collect()
    };
    match f.get("prompt") {
        None => Err(ApiError::bad("prompt", "`prompt` is required")),
        Some(Value::String(s)) => Ok(Prompt::Text(s.clone())),
        Some(Value::Array(items)) => match items.as_slice() {
            [] => Err(ApiError::bad("prompt", "`prompt` is empty")),
            [Value::String(s)] => Ok(Prompt::Text(s.clone())),
            [Value::Array(ids)] => Ok(Prompt::Tokens(tokens(ids)?)),
            [Value::Number(_), ..] => Ok(Prompt::Tokens(tokens(items)?)),
            [_] => Err(ApiError::bad("prompt", "`prompt` must be a string, an array of token ids, or one of either")),
            _ => Err(ApiError::bad(
                "prompt",
                "only one prompt per request is supported (batch them as separate requests)",
            )),
        },
        Some(v) => Err(ApiError::bad("prompt", format!("`prompt` must be a string or an array, not {}", kind(v)))),
    }
}

/// The conversation. Earlier calls and results are kept as the template's own messages where it has its own call
/// format, and written in the JSON protocol's shapes otherwise.
fn parse_messages(f: &Fields<'_>, style: ToolStyle) -> Result<Vec<ChatMessage>, ApiError> {
    let items = match f.get("messages") {
        None => return Err(ApiError::bad("messages", "`messages` is required")),
        Some(Value::Array(items)) if !items.is_empty() => items,
        Some(Value::Array(_)) => return Err(ApiError::bad("messages", "`messages` is empty")),
        Some(v) => return Err(ApiError::bad("messages", format!("`messages` must be an array, not {}", kind(v)))),
    };
    let mut out = Vec::with_capacity(items.len());
    // Calls made so far (their results name them by id), and results waiting to become one user message.
    let mut calls: Vec<PastCall> = Vec::new();
    let mut results: Vec<ToolResult> = Vec::new();
    for (i, item) in items.iter().enumerate() {
        let param = format!("messages[{i}]");
        let Value::Object(m) = item else {
            return Err(ApiError::bad(&param, format!("`{param}` must be an object, not {}", kind(item))));
        };
        let role = match m.get("role") {
            Some(Value::String(r)) if ["system", "developer", "user", "assistant", "tool"].contains(&r.as_str()) => {
                // The chat templates know `system`; OpenAI's newer name for it is `developer`.
                if r == "developer" { "system".to_string() } else { r.clone() }
            }
            Some(Value::String(r)) => {
                return Err(ApiError::bad(&format!("{param}.role"), format!("unknown role `{r}` in `{param}`")));
            }
            _ => return Err(ApiError::bad(&format!("{param}.role"), format!("`{param}.role` must be a string"))),
        };
        let past = match (role.as_str(), m.get("tool_calls")) {
            ("assistant", Some(v)) if !v.is_null() => parse_past_calls(v, &format!("{param}.tool_calls"))?,
            _ => Vec::new(),
        };
        let content = match m.get("content") {
            Some(Value::String(s)) => s.clone(),
            Some(Value::Null) | None if role == "assistant" => String::new(),
            Some(Value::Array(parts)) => {
                let mut text = String::new();
                for part in parts {
                    match (part.get("type").and_then(Value::as_str), part.get("text").and_then(Value::as_str)) {
                        (Some("text"), Some(t)) => text.push_str(t),
                        _ => {
                            return Err(ApiError::bad(
                                &format!("{param}.content"),
                                "only text content parts ({\"type\": \"text\", \"text\": ...}) are supported",
                            ));
                        }
                    }
                }
                text
            }
            _ => {
                return Err(ApiError::bad(
                    &format!("{param}.content"),
                    format!("`{param}.content` must be a string or an array of text parts"),
                ));
            }
        };
        if role == "tool" {
            // A call's result: it joins the others that follow the same turn, written back as the tools
            // protocol has them (one user message), which every template can render.
            let call_id = match m.get("tool_call_id") {
                None | Some(Value::Null) => None,
                Some(Value::String(id)) => Some(id.clone()),
                Some(v) => {
                    return Err(ApiError::bad(
                        &format!("{param}.tool_call_id"),
                        format!("`{param}.tool_call_id` must be a string, not {}", kind(v)),
                    ));
                }
            };
            if style != ToolStyle::Json {
                out.push(ChatMessage { tool_call_id: call_id, ..ChatMessage::new("tool", content) });
                continue;
            }
            let name = call_id
                .as_ref()
                .and_then(|id| calls.iter().rev().find(|c| &c.id == id))
                .map(|c| c.name.clone())
                .or_else(|| m.get("name").and_then(Value::as_str).map(str::to_string));
            results.push(ToolResult { call_id, name, content });
            continue;
        }
        if !results.is_empty() {
            out.push(ChatMessage::new("user", crate::tools::results_text(&std::mem::take(&mut results))));
        }
        if past.is_empty() {
            out.push(ChatMessage::new(role, content));
        } else if style != ToolStyle::Json {
            let tool_calls = Some(crate::tools::past_calls_json(&past));
            out.push(ChatMessage { tool_calls, ..ChatMessage::new("assistant", content) });
        } else {
            out.push(ChatMessage::new("assistant", crate::tools::calls_text(&content, &past)));
            calls.extend(past);
        }
    }
    if !results.is_empty() {
        out.push(ChatMessage::new("user", crate::tools::results_text(&results)));
    }
    Ok(out)
}

/// An assistant message's `tool_calls`: `[{"id", "type": "function", "function": {"name", "arguments"}}]`, the
/// arguments a JSON text (as OpenAI sends them back) or an object.
fn parse_past_calls(v: &Value, param: &str) -> Result<Vec<PastCall>, ApiError> {
    let bad = |what: String| ApiError::bad(param, what);
    let Value::Array(items) = v else {
        return Err(bad(format!("`{param}` must be an array, not {}", kind(v))));
    };
    let mut out = Vec::with_capacity(items.len());
    for (j, item) in items.iter().enumerate() {
        let at = format!("{param}[{j}]");
        let func = item.get("function").filter(|f| f.is_object());
        let name = func.and_then(|f| f.get("name")).and_then(Value::as_str);
        let (Some(func), Some(name)) = (func, name) else {
            return Err(bad(format!(
                "`{at}` must be {{\"id\", \"type\": \"function\", \"function\": {{\"name\", \"arguments\"}}}}"
            )));
        };
        let arguments = match func.get("arguments") {
            None | Some(Value::Null) => json!({}),
            Some(Value::String(text)) => {
                serde_json::from_str(text).map_err(|e| bad(format!("`{at}.function.arguments` is not JSON: {e}")))?
            }
            Some(o @ Value::Object(_)) => o.clone(),
            Some(v) => return Err(bad(format!("`{at}.function.arguments` must be a JSON text, not {}", kind(v)))),
        };
        let id = item.get("id").and_then(Value::as_str).unwrap_or_default().to_string();
        out.push(PastCall { id, name: name.to_string(), arguments });
    }
    Ok(out)
}

pub fn finish_reason(f: FinishReason) -> &'static str {
    match f {
        FinishReason::Stop => "stop",
        FinishReason::Length => "length",
        // Not sent to a client that went away; here for completeness.
        FinishReason::Cancelled => "abort",
    }
}

pub fn usage_json(u: &Usage) -> Value {
    json!({
        "prompt_tokens": u.prompt_tokens,
        "completion_tokens": u.completion_tokens,
        "total_tokens": u.prompt_tokens + u.completion_tokens,
        "prompt_tokens_details": { "cached_tokens": u.cached_tokens },
    })
}

/// One finished choice of a whole response.
pub struct ChoiceOut {
    pub text: String,
    pub finish: &'static str,
    pub logprobs: Option<Value>,
    /// The calls a tool reply made (chat); the text is then what was said before them (in the JSON style, nothing).
    pub tool_calls: Option<Vec<ToolCall>>,
}

/// A whole reply's calls as OpenAI lists them (`arguments` a JSON text).
pub fn tool_calls_json(calls: &[ToolCall]) -> Value {
    calls
        .iter()
        .map(|c| json!({"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}))
        .collect()
}

/// What identifies one response's chunks.
pub struct ResponseMeta<'a> {
    pub id: &'a str,
    pub created: u64,
    pub model: &'a str,
    pub chat: bool,
}

impl ResponseMeta<'_> {
    /// A whole (non-streamed) response: its choices in order.
    pub fn full(&self, choices: &[ChoiceOut], usage: &Usage) -> Value {
        let choices: Vec<Value> = choices
            .iter()
            .enumerate()
            .map(|(index, c)| {
                let logprobs = c.logprobs.clone().unwrap_or(Value::Null);
                if self.chat {
                    let message = match &c.tool_calls {
                        Some(calls) => json!({
                            "role": "assistant",
                            // Words said before the calls (Hermes' format lets a model write some).
                            "content": if c.text.is_empty() { Value::Null } else { json!(c.text) },
                            "tool_calls": tool_calls_json(calls),
                        }),
                        None => json!({ "role": "assistant", "content": c.text }),
                    };
                    json!({ "index": index, "message": message, "logprobs": logprobs, "finish_reason": c.finish })
                } else {
                    json!({ "index": index, "text": c.text, "logprobs": logprobs, "finish_reason": c.finish })
                }
            })
            .collect();
        json!({
            "id": self.id,
            "object": if self.chat { "chat.completion" } else { "text_completion" },
            "created": self.created,
            "model": self.model,
            "choices": choices,
            "usage": usage_json(usage),
        })
    }

    /// One streamed chunk of choice `index`: new text, or (with `finish`) its last one, which also carries the
    /// usage unless a separate usage chunk follows. A choice's first chat chunk announces the role.
    pub fn chunk(
        &self,
        index: usize,
        text: Option<&str>,
        first: bool,
        finish: Option<&str>,
        usage: Option<&Usage>,
        logprobs: Option<Value>,
    ) -> Value {
        let logprobs = logprobs.unwrap_or(Value::Null);
        let choice = if self.chat {
            let mut delta = Map::new();
            if first {
                delta.insert("role".into(), json!("assistant"));
            }
            if let Some(t) = text {
                delta.insert("content".into(), json!(t));
            }
            json!({ "index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish })
        } else {
            json!({ "index": index, "text": text.unwrap_or(""), "logprobs": logprobs, "finish_reason": finish })
        };
        let mut out = json!({
            "id": self.id,
            "object": if self.chat { "chat.completion.chunk" } else { "text_completion" },
            "created": self.created,
            "model": self.model,
            "choices": [choice],
        });
        if let Some(u) = usage {
            out["usage"] = usage_json(u);
        }
        out
    }

    /// The usage-only chunk `stream_options.include_usage` asks for (no choices).
    pub fn usage_chunk(&self, usage: &Usage) -> Value {
        json!({
            "id": self.id,
            "object": if self.chat { "chat.completion.chunk" } else { "text_completion" },
            "created": self.created,
            "model": self.model,
            "choices": [],
            "usage": usage_json(usage),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(body: &str, chat: bool) -> ApiError {
        parse(body.as_bytes(), chat).unwrap_err()
    }

    #[test]
    fn fields_of_the_wrong_type_are_named() {
        let e = err(r#"{"prompt": "hi", "max_tokens": "ten"}"#, false);
        assert_eq!((e.status, e.param.as_deref()), (400, Some("max_tokens")));
        assert!(e.message.contains("must be an integer, not a string"), "{}", e.message);
        let e = err(r#"{"messages": [{"role": "user", "content": 5}]}"#, true);
        assert_eq!(e.param.as_deref(), Some("messages[0].content"));
        let e = err(r#"{"prompt": "hi", "temperature": -1}"#, false);
        assert_eq!(e.param.as_deref(), Some("temperature"));
        for field in ["presence_penalty", "frequency_penalty"] {
            let e = err(&format!(r#"{{"prompt": "hi", "{field}": 2.5}}"#), false);
            assert_eq!((e.status, e.param.as_deref()), (400, Some(field)));
            assert!(e.message.contains("[-2, 2]"), "{}", e.message);
        }
        for (bias, needle) in [
            (r#"{"12": 101}"#, "[-100, 100]"),
            (r#"{"12": "5"}"#, "must be a number"),
            (r#"{"x": 1}"#, "'x' is not a token id"),
            (r#"{"-1": 1}"#, "not a token id"),
            (r#"[[12]]"#, "[token id, bias]"),
            (r#"[[12, true]]"#, "must be a number"),
            (r#"5"#, "must be an object"),
        ] {
            let e = err(&format!(r#"{{"prompt": "hi", "logit_bias": {bias}}}"#), false);
            assert_eq!((e.status, e.param.as_deref()), (400, Some("logit_bias")), "{bias}");
            assert!(e.message.contains(needle), "{bias}: {}", e.message);
        }
        let e = err(r#"{"prompt": "hi", "repeat_last_n": -2}"#, false);
        assert_eq!(e.param.as_deref(), Some("repeat_last_n"));
        for n in ["0", "129", "2.5"] {
            let e = err(&format!(r#"{{"prompt": "hi", "n": {n}}}"#), false);
            assert_eq!(e.param.as_deref(), Some("n"), "{n}");
        }
        for body in [
            r#"{"prompt": "hi", "n": 3, "best_of": 2}"#,
            r#"{"prompt": "hi", "best_of": 129}"#,
            r#"{"prompt": "hi", "best_of": 3, "stream": true}"#,
        ] {
            assert_eq!(err(body, false).param.as_deref(), Some("best_of"), "{body}");
        }
        let e = err(r#"{"messages": [{"role": "user", "content": "hi"}], "best_of": 2}"#, true);
        assert_eq!(e.param.as_deref(), Some("best_of"));
        let r = parse(br#"{"prompt": "hi", "n": 2, "best_of": 5}"#, false).unwrap();
        assert_eq!((r.n, r.best_of), (2, 5));
        assert!(parse(br#"{"messages": [{"role": "user", "content": "hi"}], "n": 3, "best_of": 3}"#, true).is_ok());
        let e = err(r#"{"prompt": "hi", "stop": ["a", ""]}"#, false);
        assert_eq!(e.param.as_deref(), Some("stop"));
        let e = err(r#"{"prompt": "hi""#, false);
        assert!(e.message.contains("not valid JSON"), "{}", e.message);
        let e = err(r#"[1, 2]"#, false);
        assert!(e.message.contains("must be a JSON object"), "{}", e.message);
        let e = err(r#"{"max_tokens": 3}"#, false);
        assert!(e.message.contains("`prompt` is required"), "{}", e.message);
    }

    #[test]
    fn a_full_request_parses() {
        let r = parse(
            br#"{"model": "x", "messages": [{"role": "system", "content": "be brief"},
                {"role": "user", "content": [{"type": "text", "text": "hi"}]}],
                "max_completion_tokens": 5, "temperature": 0, "top_p": 0.9, "top_k": -1, "min_p": 0.1, "seed": 7,
                "stop": "\n", "stream": true, "stream_options": {"include_usage": true}, "ignore_eos": true,
                "user": "u", "unknown_field": [1, 2], "presence_penalty": 0.5, "frequency_penalty": -1.5,
                "repetition_penalty": 1.1, "repeat_last_n": -1}"#,
            true,
        )
        .unwrap();
        assert_eq!(
            r.prompt,
            Prompt::Chat(vec![ChatMessage::new("system", "be brief"), ChatMessage::new("user", "hi")])
        );
        assert_eq!(r.max_tokens, Some(5));
        assert_eq!((r.sampling.temperature, r.sampling.top_p, r.sampling.top_k, r.sampling.min_p), (0.0, 0.9, 0, 0.1));
        assert_eq!(r.sampling.seed, 7);
        let p = &r.sampling;
        assert_eq!((p.presence_penalty, p.frequency_penalty, p.repeat_penalty), (0.5, -1.5, 1.1));
        assert_eq!(p.repeat_last_n, usize::MAX);
        assert_eq!(r.stop, vec!["\n".to_string()]);
        assert!(r.stream && r.include_usage && r.ignore_eos);
        let r = parse(br#"{"prompt": "a", "logit_bias": {"7": -100, " 3 ": 2.5}}"#, false).unwrap();
        assert_eq!(r.logit_bias.entries(), &[(3, 2.5), (7, -100.0)]);
        let r = parse(br#"{"prompt": "a", "logit_bias": [[9, false], [2, 0.5]]}"#, false).unwrap();
        assert_eq!(r.logit_bias.entries(), &[(2, 0.5), (9, f32::NEG_INFINITY)]);
        let r = parse(br#"{"prompt": [[1, 2, 3]], "max_tokens": null}"#, false).unwrap();
        assert_eq!((r.prompt, r.max_tokens), (Prompt::Tokens(vec![1, 2, 3]), None));
    }

    #[test]
    fn calls_and_results_in_the_conversation_are_written_back_in_the_tools_protocol() {
        let r = parse(
            br#"{"messages": [{"role": "system", "content": "be brief"},
                {"role": "user", "content": "weather?"},
                {"role": "assistant", "content": null, "tool_calls": [
                    {"id": "c1", "type": "function", "function": {"name": "w", "arguments": "{\"city\": \"Oslo\"}"}},
                    {"id": "c2", "type": "function", "function": {"name": "t", "arguments": "{}"}}]},
                {"role": "tool", "tool_call_id": "c1", "content": "cold"},
                {"role": "tool", "tool_call_id": "c2", "content": "noon"},
                {"role": "assistant", "content": "Cold at noon."}],
                "tools": [{"type": "function", "function": {"name": "w"}}], "tool_choice": "required"}"#,
            true,
        )
        .unwrap();
        let Prompt::Chat(m) = &r.prompt else { panic!() };
        let roles: Vec<&str> = m.iter().map(|m| m.role.as_str()).collect();
        assert_eq!(roles, ["system", "user", "assistant", "user", "assistant"]);
        assert!(m[0].content.starts_with("be brief\n\nYou can call these tools:\n{\"name\":\"w\""), "{}", m[0].content);
        assert_eq!(
            m[2].content,
            r#"{"tool_calls":[{"name":"w","arguments":{"city":"Oslo"}},{"name":"t","arguments":{}}]}"#
        );
        assert_eq!(
            m[3].content,
            r#"{"tool_results":[{"tool_call_id":"c1","name":"w","content":"cold"},{"tool_call_id":"c2","name":"t","content":"noon"}]}"#
        );
        let tools = r.tools.as_ref().unwrap();
        assert!(matches!(r.format, OutputFormat::JsonSchema(_)) && r.format == tools.format());
        // Without tools the history is written the same way, and nothing is added to the system message.
        let r = parse(br#"{"messages": [{"role": "user", "content": "a"}, {"role": "tool", "content": "b"}]}"#, true);
        let r = r.unwrap();
        assert_eq!(
            r.prompt,
            Prompt::Chat(vec![
                ChatMessage::new("user", "a"),
                ChatMessage::new("user", r#"{"tool_results":[{"content":"b"}]}"#)
            ])
        );
        assert!(r.tools.is_none() && r.format == OutputFormat::Text);
    }

    #[test]
    fn templates_with_a_call_format_get_the_tools_calls_and_results_as_their_own() {
        let body = br#"{"messages": [{"role": "system", "content": "be brief"},
            {"role": "user", "content": "weather?"},
            {"role": "assistant", "content": null, "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "w", "arguments": "{\"city\": \"Oslo\"}"}},
                {"id": "c2", "type": "function", "function": {"name": "t", "arguments": "{}"}}]},
            {"role": "tool", "tool_call_id": "c1", "content": "cold"},
            {"role": "tool", "tool_call_id": "c2", "content": "noon"}],
            "tools": [{"type": "function", "function": {"name": "w", "description": "The weather"}},
                      {"type": "function", "function": {"name": "t"}}]}"#;
        let r = parse_in(body, true, ToolStyle::Hermes).unwrap();
        let Prompt::Chat(m) = &r.prompt else { panic!() };
        let roles: Vec<&str> = m.iter().map(|m| m.role.as_str()).collect();
        assert_eq!(roles, ["system", "user", "assistant", "tool", "tool"]);
        assert_eq!(m[0].content, "be brief", "the template lists the tools, not the system message");
        assert_eq!(m[2].tool_calls.as_ref().unwrap()[0]["function"]["arguments"], json!({"city": "Oslo"}));
        assert_eq!(m[4].tool_call_id.as_deref(), Some("c2"));
        assert!(matches!(r.format, OutputFormat::NativeCalls(_)));
        // A request's conversation and tools as `source` renders them.
        let render = |source: &str, bos: &str, r: &GenerationRequest| {
            let Prompt::Chat(m) = &r.prompt else { panic!() };
            let template = crate::tokenizer::chat::ChatTemplate::new("test", source, bos, "").unwrap();
            template.render_with_tools(m, r.tools.as_ref().unwrap().template_tools(), true).unwrap()
        };
        // Every part in the text, and the text ends with the prompt for the reply.
        let holds = |text: &str, parts: &[&str], end: &str| {
            for part in parts {
                assert!(text.contains(part), "{part:?} not in:\n{text}");
            }
            assert!(text.ends_with(end), "{text}");
        };
        let text = render(include_str!("../../tests/data/tagged-tools.jinja"), "", &r);
        holds(
            &text,
            &[
                "<|im_start|>system\nbe brief\n\nYou can call these functions",
                r#"{"function":{"description":"The weather","name":"w","parameters":"#,
                "<|im_start|>assistant\n<tool_call>\n{\"name\": \"w\", \"arguments\": {\"city\":\"Oslo\"}}\n</tool_call>\n",
                "<|im_start|>user\n<tool_response>\ncold\n</tool_response>\n<tool_response>\nnoon\n</tool_response>\n<|im_end|>",
            ],
            "<|im_start|>assistant\n",
        );
        assert_eq!(text.matches("be brief").count(), 1, "{text}");

        // Llama 3's: the tools in the first user turn, the call a bare object, the results ipython turns.
        let body = br#"{"messages": [{"role": "system", "content": "be brief"},
            {"role": "user", "content": "weather?"},
            {"role": "assistant", "content": null, "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "w", "arguments": "{\"city\": \"Oslo\"}"}}]},
            {"role": "tool", "tool_call_id": "c1", "content": "cold"}],
            "tools": [{"type": "function", "function": {"name": "w", "description": "The weather"}}]}"#;
        let r = parse_in(body, true, ToolStyle::Llama3).unwrap();
        let text = render(include_str!("../../tests/data/llama3-tools.jinja"), "<|begin_of_text|>", &r);
        holds(
            &text,
            &[
                "<|start_header_id|>system<|end_header_id|>\n\nEnvironment: ipython\nbe brief<|eot_id|>",
                "These functions are available.",
                r#"{"function":{"description":"The weather","name":"w","parameters":"#,
                "<|start_header_id|>assistant<|end_header_id|>\n\n{\"name\": \"w\", \"parameters\": {\"city\":\"Oslo\"}}<|eot_id|>",
                "<|start_header_id|>ipython<|end_header_id|>\n\ncold<|eot_id|>",
            ],
            "<|start_header_id|>assistant<|end_header_id|>\n\n",
        );
    }
}
