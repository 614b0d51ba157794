//! Chat templates: a model's `tokenizer.chat_template` (Jinja) rendered with minijinja.
//!
//! The environment mirrors what Hugging Face `apply_chat_template` offers templates: `trim_blocks` and
//! `lstrip_blocks` on, the variables `messages`, `add_generation_prompt`, `bos_token` and `eos_token`, the function
//! `raise_exception(msg)` (rendering fails with `msg`), `strftime_now(format)` (the current UTC time), and Python
//! string/list/dict methods (`.strip()`, `.startswith()`, `.items()`, ... via minijinja-contrib's pycompat).
//!
//! Rendering is bounded: minijinja's fuel limits the instructions executed, the recursion limit the nesting, and the
//! output stops at [`MAX_OUTPUT`] bytes. Those do not bound the values a template builds along the way (forty
//! `{% set ns.s = ns.s ~ ns.s %}` ask for a terabyte in forty instructions), so each render runs on its own thread
//! under a memory budget and a time limit ([`RenderLimits`], enforced by [`infer_kernels::budget`] when the program
//! installs its allocator, as the `infer` binary does). A template that passes either limit is refused from then on
//! without being run again. Templates have no loader, so `include`/`import`/`extends` cannot reach the filesystem.
//! Every failure is a [`TemplateError`], never a panic.
//!
//! A model without a template gets a built-in one that fits its architecture: [`GEMMA`] for the Gemma family,
//! [`CHATML`] otherwise.

use std::io;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use infer_kernels::budget::{self, Bounded};

use minijinja::{Environment, Error, ErrorKind, Value, context};
use serde::{Deserialize, Serialize};
use thiserror::Error;

use crate::gguf::{GgufError, GgufFile, Metadata};

use super::keys;

/// Largest rendered prompt (bytes).
pub const MAX_OUTPUT: usize = 16 << 20;
/// Largest template source accepted (bytes).
pub const MAX_SOURCE: usize = 1 << 20;
/// Instructions a render may execute (minijinja fuel).
const FUEL: u64 = 10_000_000;
/// Deepest nesting of calls, macros and blocks.
const RECURSION_LIMIT: usize = 64;

/// The memory and time one render may take.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RenderLimits {
    /// Bytes the rendering thread may hold at once: the conversation, every value the template builds, the output.
    pub memory: usize,
    /// Wall-clock time before the render is abandoned.
    pub time: Duration,
}

impl RenderLimits {
    /// 256 MiB and 5 s: a real template renders a 16 MiB conversation in a few times its size and well under a
    /// second, and both stay far below what would hurt the machine (2 GiB, a 10 s hang).
    pub const DEFAULT: RenderLimits = RenderLimits { memory: 256 << 20, time: Duration::from_secs(5) };
}

/// ChatML, as written by OpenAI and used by SmolLM2, Qwen and many others:
/// `<|im_start|>{role}\n{content}<|im_end|>\n` per message, and `<|im_start|>assistant\n` to prompt a reply.
pub const CHATML: &str = "{%- for message in messages %}\
{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}\
{%- endfor %}\
{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}";

/// Gemma's turn format (Google's Gemma documentation): BOS, then `<start_of_turn>{user|model}\n{content}
/// <end_of_turn>\n` per turn, `assistant` spelled `model`; a system message has no turn of its own and is put,
/// followed by a blank line, at the start of the first user turn. `<start_of_turn>model\n` prompts a reply.
pub const GEMMA: &str = "{{- bos_token }}\
{%- set ns = namespace(system='') %}\
{%- for message in messages %}\
{%- if message['role'] == 'system' %}\
{%- set ns.system = ns.system + message['content'] | trim + '\\n\\n' %}\
{%- else %}\
{%- if message['role'] == 'assistant' %}{% set role = 'model' %}{% else %}{% set role = message['role'] %}{% endif %}\
{{- '<start_of_turn>' + role + '\\n' }}\
{%- if role == 'user' and ns.system %}{{- ns.system }}{% set ns.system = '' %}{% endif %}\
{{- message['content'] | trim }}{{- '<end_of_turn>\\n' }}\
{%- endif %}\
{%- endfor %}\
{%- if add_generation_prompt %}{{- '<start_of_turn>model\\n' }}{%- endif %}";

/// The built-in templates by name.
pub const BUILTINS: &[(&str, &str)] = &[("chatml", CHATML), ("gemma", GEMMA)];

/// One message of a conversation.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChatMessage {
    pub role: String,
    pub content: String,
    /// An assistant message's calls, for templates that write them (OpenAI's shape, the arguments an object).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<serde_json::Value>,
    /// A `tool` message's call id, for templates that write results themselves.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
}

impl ChatMessage {
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> ChatMessage {
        ChatMessage { role: role.into(), content: content.into(), tool_calls: None, tool_call_id: None }
    }
}

#[derive(Debug, Error)]
pub enum TemplateError {
    #[error("chat template `{name}` does not parse: {detail}")]
    Syntax { name: String, detail: String },
    #[error("chat template `{name}` failed to render: {detail}")]
    Render { name: String, detail: String },
    #[error("chat template `{name}` raised an exception: {message}")]
    Raised { name: String, message: String },
    #[error("chat template `{name}` produced more than {limit} bytes")]
    OutputTooLarge { name: String, limit: usize },
    #[error(
        "chat template `{name}` needed more than {mib} MiB of memory while rendering; it is not run again",
        mib = limit >> 20
    )]
    MemoryLimit { name: String, limit: usize },
    #[error("chat template `{name}` took longer than {seconds} s to render; it is not run again")]
    TimeLimit { name: String, seconds: f64 },
    #[error("chat template `{name}` is {len} bytes, more than the {limit}-byte limit")]
    SourceTooLarge { name: String, len: usize, limit: usize },
    #[error("`{0}` is not a built-in chat template (built-ins: chatml, gemma)")]
    UnknownBuiltin(String),
    #[error("`{key}` = {id} is not a token id (the vocabulary has {n_vocab} tokens)")]
    BadTokenId { key: &'static str, id: u32, n_vocab: usize },
    #[error("reading chat template {name}: {detail}")]
    Io { name: String, detail: String },
    #[error(transparent)]
    Metadata(#[from] GgufError),
}

/// A chat template ready to render.
pub struct ChatTemplate {
    name: String,
    source: String,
    bos_token: String,
    eos_token: String,
    limits: RenderLimits,
    /// Set once a render passed a limit: the template is not run again.
    tripped: Mutex<Option<Tripped>>,
}

/// Which limit a render passed.
#[derive(Clone, Copy, Debug)]
enum Tripped {
    Memory(usize),
    Time(Duration),
}

impl std::fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChatTemplate").field("name", &self.name).field("len", &self.source.len()).finish()
    }
}

/// The message of the last `raise_exception` call during a render.
type Raised = Arc<Mutex<Option<String>>>;

impl ChatTemplate {
    /// Compiles `source` (its syntax is checked here). `name` appears in error messages.
    pub fn new(
        name: impl Into<String>,
        source: impl Into<String>,
        bos_token: impl Into<String>,
        eos_token: impl Into<String>,
    ) -> Result<ChatTemplate, TemplateError> {
        let name = name.into();
        let source = source.into();
        if source.len() > MAX_SOURCE {
            return Err(TemplateError::SourceTooLarge { name, len: source.len(), limit: MAX_SOURCE });
        }
        // Compile once here so that a syntax error surfaces when the template is loaded.
        make_env(&name, &source, Arc::new(Mutex::new(None)))?;
        Ok(ChatTemplate {
            name,
            source,
            bos_token: bos_token.into(),
            eos_token: eos_token.into(),
            limits: RenderLimits::DEFAULT,
            tripped: Mutex::new(None),
        })
    }

    /// The same template under other limits (tests and fuzzing use small ones).
    pub fn with_limits(mut self, limits: RenderLimits) -> ChatTemplate {
        self.limits = limits;
        self
    }

    pub fn limits(&self) -> RenderLimits {
        self.limits
    }

    /// A built-in template by name (`chatml`, `gemma`).
    pub fn builtin(name: &str, bos_token: &str, eos_token: &str) -> Result<ChatTemplate, TemplateError> {
        let (n, src) =
            BUILTINS.iter().find(|(n, _)| *n == name).ok_or_else(|| TemplateError::UnknownBuiltin(name.to_string()))?;
        ChatTemplate::new(*n, *src, bos_token, eos_token)
    }

    /// The name of the built-in template that fits an architecture (`general.architecture`).
    pub fn builtin_for_arch(arch: &str) -> &'static str {
        if arch.starts_with("gemma") { "gemma" } else { "chatml" }
    }

    /// The template for a model: `override_template` if given (a built-in's name, or template source such as the
    /// contents of a `--chat-template FILE`), else the file's `tokenizer.chat_template`, else the built-in that fits
    /// `general.architecture`.
    pub fn from_gguf(file: &GgufFile, override_template: Option<&str>) -> Result<ChatTemplate, TemplateError> {
        ChatTemplate::from_metadata(file.metadata(), override_template)
    }

    /// As [`ChatTemplate::from_gguf`], from the metadata.
    pub fn from_metadata(md: &Metadata, override_template: Option<&str>) -> Result<ChatTemplate, TemplateError> {
        let tokens = md.get_string_array(keys::TOKENS)?;
        let text_of = |key: &'static str| -> Result<String, TemplateError> {
            match md.opt_u32(key)? {
                None => Ok(String::new()),
                Some(id) => tokens.get(id as usize).map(str::to_string).ok_or(TemplateError::BadTokenId {
                    key,
                    id,
                    n_vocab: tokens.len(),
                }),
            }
        };
        let bos = text_of(keys::BOS)?;
        let eos = text_of(keys::EOS)?;
        if let Some(o) = override_template {
            if BUILTINS.iter().any(|(n, _)| *n == o) {
                return ChatTemplate::builtin(o, &bos, &eos);
            }
            return ChatTemplate::new("--chat-template", o, bos, eos);
        }
        if let Some(src) = md.opt_str(keys::CHAT_TEMPLATE)? {
            return ChatTemplate::new(keys::CHAT_TEMPLATE, src, bos, eos);
        }
        let arch = md.opt_str(keys::ARCHITECTURE)?.unwrap_or("");
        ChatTemplate::builtin(ChatTemplate::builtin_for_arch(arch), &bos, &eos)
    }

    /// Reads a template file (`--chat-template FILE`) for [`ChatTemplate::from_gguf`]'s override.
    pub fn read_file(path: &std::path::Path) -> Result<String, TemplateError> {
        let name = path.display().to_string();
        let len =
            std::fs::metadata(path).map_err(|e| TemplateError::Io { name: name.clone(), detail: e.to_string() })?.len();
        if len > MAX_SOURCE as u64 {
            return Err(TemplateError::SourceTooLarge { name, len: len as usize, limit: MAX_SOURCE });
        }
        std::fs::read_to_string(path).map_err(|e| TemplateError::Io { name, detail: e.to_string() })
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn source(&self) -> &str {
        &self.source
    }

    /// Renders a conversation; `add_generation_prompt` appends the text that opens the assistant's reply. The render
    /// runs on its own thread within [`RenderLimits`].
    pub fn render(&self, messages: &[ChatMessage], add_generation_prompt: bool) -> Result<String, TemplateError> {
        self.render_with_tools(messages, None, add_generation_prompt)
    }

    /// [`render`](Self::render) with `tools` (OpenAI's request shape) for templates that list them.
    pub fn render_with_tools(
        &self,
        messages: &[ChatMessage],
        tools: Option<serde_json::Value>,
        add_generation_prompt: bool,
    ) -> Result<String, TemplateError> {
        if let Some(t) = self.tripped.lock().ok().and_then(|t| *t) {
            return Err(self.limit_error(t));
        }
        // Global caches of the template engine fill on first use; filling them here, outside any budget, means a
        // render stopped at its limit can never be holding one half-built (which would block every later render).
        warm_up();
        // The environment (with the compiled template) is built here and moved to the rendering thread, so the
        // budget covers the render alone.
        let raised: Raised = Arc::new(Mutex::new(None));
        let env = make_env(&self.name, &self.source, raised.clone())?;
        let (name, bos, eos) = (self.name.clone(), self.bos_token.clone(), self.eos_token.clone());
        let messages = messages.to_vec();
        let outcome = budget::run_bounded(self.limits.memory, self.limits.time, move || {
            render_in(&env, &name, &messages, tools.as_ref(), add_generation_prompt, &bos, &eos, &raised)
        });
        let tripped = match outcome {
            Bounded::Done(result) => return result,
            Bounded::OverBudget { budget } => Tripped::Memory(budget),
            Bounded::TimedOut { limit } => Tripped::Time(limit),
            Bounded::Panicked => {
                return Err(TemplateError::Render { name: self.name.clone(), detail: "the renderer panicked".into() });
            }
            Bounded::NoThread(detail) => return Err(TemplateError::Render { name: self.name.clone(), detail }),
        };
        if let Ok(mut t) = self.tripped.lock() {
            *t = Some(tripped);
        }
        Err(self.limit_error(tripped))
    }

    fn limit_error(&self, t: Tripped) -> TemplateError {
        match t {
            Tripped::Memory(limit) => TemplateError::MemoryLimit { name: self.name.clone(), limit },
            Tripped::Time(d) => TemplateError::TimeLimit { name: self.name.clone(), seconds: d.as_secs_f64() },
        }
    }
}

/// One render, on the bounded thread.
#[allow(clippy::too_many_arguments)]
fn render_in(
    env: &Environment<'static>,
    name: &str,
    messages: &[ChatMessage],
    tools: Option<&serde_json::Value>,
    add_generation_prompt: bool,
    bos_token: &str,
    eos_token: &str,
    raised: &Raised,
) -> Result<String, TemplateError> {
    let render_error = |e: &Error| TemplateError::Render { name: name.to_string(), detail: describe(e) };
    let tmpl = env.get_template(name).map_err(|e| render_error(&e))?;
    let ctx = context! {
        messages => messages,
        add_generation_prompt => add_generation_prompt,
        bos_token => bos_token,
        eos_token => eos_token,
    };
    // `tools` only where there are some: templates test `tools is defined` as often as its truth.
    let ctx = match tools {
        Some(tools) => context! { tools => tools, ..ctx },
        None => ctx,
    };
    let mut out = CappedWriter { buf: Vec::new(), limit: MAX_OUTPUT, overflowed: false };
    let result = tmpl.render_captured_to(ctx, &mut out).map(|_| ());
    if out.overflowed {
        return Err(TemplateError::OutputTooLarge { name: name.to_string(), limit: MAX_OUTPUT });
    }
    if let Err(e) = result {
        if let Some(message) = raised.lock().ok().and_then(|m| m.clone()) {
            return Err(TemplateError::Raised { name: name.to_string(), message });
        }
        return Err(render_error(&e));
    }
    // Output is the concatenation of strings: valid UTF-8.
    String::from_utf8(out.buf)
        .map_err(|_| TemplateError::Render { name: name.to_string(), detail: "output is not valid UTF-8".to_string() })
}

/// Fills the template engine's process-wide caches (number formatting, the default filters) once.
fn warm_up() {
    static DONE: std::sync::Once = std::sync::Once::new();
    DONE.call_once(|| {
        let env = Environment::new();
        let _ = env.render_str("{{ 7 }}{{ 1.5 }}{{ [1, 'a', none] | tojson }}{{ 'x' | upper }}", ());
    });
}

/// An error with its causes, on one line.
fn describe(e: &Error) -> String {
    let mut s = e.to_string();
    let mut cur: Option<&(dyn std::error::Error + 'static)> = std::error::Error::source(e);
    while let Some(c) = cur {
        s.push_str(": ");
        s.push_str(&c.to_string());
        cur = c.source();
    }
    s
}

fn make_env(name: &str, source: &str, raised: Raised) -> Result<Environment<'static>, TemplateError> {
    let mut env = Environment::new();
    env.set_trim_blocks(true);
    env.set_lstrip_blocks(true);
    env.set_fuel(Some(FUEL));
    env.set_recursion_limit(RECURSION_LIMIT);
    minijinja_contrib::add_to_environment(&mut env);
    env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
    env.add_function("raise_exception", move |msg: String| -> Result<Value, Error> {
        // Copied before the lock is taken: a render stopped at its memory limit must not be holding it.
        let copy = msg.clone();
        if let Ok(mut r) = raised.lock() {
            *r = Some(copy);
        }
        Err(Error::new(ErrorKind::InvalidOperation, msg))
    });
    env.add_function("strftime_now", |format: String| -> Result<Value, Error> {
        let secs =
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs() as i64).unwrap_or(0);
        Ok(Value::from(strftime(&format, secs)))
    });
    env.add_template_owned(name.to_string(), source.to_string())
        .map_err(|e| TemplateError::Syntax { name: name.to_string(), detail: describe(&e) })?;
    Ok(env)
}

struct CappedWriter {
    buf: Vec<u8>,
    limit: usize,
    overflowed: bool,
}

impl io::Write for CappedWriter {
    fn write(&mut self, data: &[u8]) -> io::Result<usize> {
        if self.buf.len() + data.len() > self.limit {
            self.overflowed = true;
            return Err(io::Error::other("chat template output limit reached"));
        }
        self.buf.extend_from_slice(data);
        Ok(data.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// Civil date from days since 1970-01-01 (Howard Hinnant's `civil_from_days` algorithm).
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

const MONTHS: [&str; 12] = [
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
];
const DAYS: [&str; 7] = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"];

/// A small `strftime` for UTC time: `%Y %y %m %d %e %H %M %S %B %b %A %a %j %%`; other directives are kept as
/// written.
pub fn strftime(format: &str, unix_secs: i64) -> String {
    let days = unix_secs.div_euclid(86_400);
    let secs = unix_secs.rem_euclid(86_400);
    let (y, m, d) = civil_from_days(days);
    let (hh, mm, ss) = (secs / 3600, secs / 60 % 60, secs % 60);
    // 1970-01-01 was a Thursday.
    let weekday = (days + 3).rem_euclid(7) as usize;
    let yday = days - days_from_civil(y, 1, 1) + 1;
    let month = MONTHS[(m as usize).saturating_sub(1).min(11)];
    let mut out = String::new();
    let mut chars = format.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('Y') => out.push_str(&y.to_string()),
            Some('y') => out.push_str(&format!("{:02}", y.rem_euclid(100))),
            Some('m') => out.push_str(&format!("{m:02}")),
            Some('d') => out.push_str(&format!("{d:02}")),
            Some('e') => out.push_str(&format!("{d:>2}")),
            Some('H') => out.push_str(&format!("{hh:02}")),
            Some('M') => out.push_str(&format!("{mm:02}")),
            Some('S') => out.push_str(&format!("{ss:02}")),
            Some('B') => out.push_str(month),
            Some('b') => out.push_str(&month[..3]),
            Some('A') => out.push_str(DAYS[weekday]),
            Some('a') => out.push_str(&DAYS[weekday][..3]),
            Some('j') => out.push_str(&format!("{yday:03}")),
            Some('%') => out.push('%'),
            Some(other) => {
                out.push('%');
                out.push(other);
            }
            None => out.push('%'),
        }
    }
    out
}

/// Days since 1970-01-01 of a civil date (Howard Hinnant's `days_from_civil`).
fn days_from_civil(y: i64, m: u32, d: u32) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y.rem_euclid(400);
    let m = i64::from(m);
    let doy = (153 * (if m > 2 { m - 3 } else { m + 9 }) + 2) / 5 + i64::from(d) - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

#[cfg(test)]
mod tests {
    use super::*;

    fn conv() -> Vec<ChatMessage> {
        vec![
            ChatMessage::new("system", "Be brief."),
            ChatMessage::new("user", "Hi"),
            ChatMessage::new("assistant", "Hello!"),
            ChatMessage::new("user", "Bye"),
        ]
    }

    #[test]
    fn chatml_builtin() {
        let t = ChatTemplate::builtin("chatml", "", "<|im_end|>").unwrap();
        assert_eq!(
            t.render(&conv(), true).unwrap(),
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nHello!<|im_end|>\n<|im_start|>user\nBye<|im_end|>\n<|im_start|>assistant\n"
        );
    }

    #[test]
    fn gemma_builtin() {
        let t = ChatTemplate::builtin("gemma", "<bos>", "<eos>").unwrap();
        assert_eq!(
            t.render(&conv(), true).unwrap(),
            "<bos><start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n<start_of_turn>model\nHello!<end_of_turn>\n<start_of_turn>user\nBye<end_of_turn>\n<start_of_turn>model\n"
        );
        assert_eq!(t.render(&conv()[1..2], false).unwrap(), "<bos><start_of_turn>user\nHi<end_of_turn>\n");
    }

    #[test]
    fn failures_are_errors() {
        assert!(matches!(ChatTemplate::new("t", "{% for %}", "", ""), Err(TemplateError::Syntax { .. })));
        let t = ChatTemplate::new("t", "{{ raise_exception('roles must alternate') }}", "", "").unwrap();
        match t.render(&conv(), false) {
            Err(TemplateError::Raised { message, .. }) => assert_eq!(message, "roles must alternate"),
            other => panic!("{other:?}"),
        }
        let t = ChatTemplate::new(
            "t",
            "{% for i in range(100000) %}{% for j in range(100000) %}x{% endfor %}{% endfor %}",
            "",
            "",
        )
        .unwrap();
        assert!(t.render(&conv(), false).is_err());
        let t = ChatTemplate::new("t", "{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", "", "").unwrap();
        assert!(t.render(&conv(), false).is_err());
        let t = ChatTemplate::new("t", "{% include '/etc/passwd' %}", "", "").unwrap();
        assert!(t.render(&conv(), false).is_err());
        let t = ChatTemplate::new("t", "{{ messages[0].content.strip().upper() }}", "", "").unwrap();
        assert_eq!(t.render(&conv(), false).unwrap(), "BE BRIEF.");
    }

    #[test]
    fn strftime_formats() {
        // 2026-11-29 06:53:24 UTC, a Sunday.
        assert_eq!(strftime("%Y-%m-%d %H:%M:%S %A %b %j %%", 1_795_935_204), "2026-11-29 06:53:24 Sunday Nov 333 %");
        assert_eq!(strftime("%d %B %Y", 0), "01 January 1970");
    }
}
