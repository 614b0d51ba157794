//! Chat-template checks: it renders a sample conversation, keeps every message, opens the reply when asked to, and
//! ends a finished reply with a token that ends generation.

use super::{Check, Status};
use crate::gguf::Metadata;
use crate::tokenizer::chat::RenderLimits;
use crate::tokenizer::{ChatMessage, ChatTemplate, TokenType, Tokenizer};

/// The checks and the rendered sample conversation.
pub struct TemplateChecks {
    pub checks: Vec<Check>,
    pub sample: Option<String>,
}

impl TemplateChecks {
    /// A template that does not load or render: that check fails, and the end of a turn cannot be seen.
    fn broken(why: String) -> TemplateChecks {
        TemplateChecks {
            checks: vec![
                Check::fail("chat template", why),
                Check::skip("end of turn", "needs a template that renders"),
            ],
            sample: None,
        }
    }
}

const SYSTEM: &str = "You are a concise assistant.";
const USER_1: &str = "What is the capital of France?";
const REPLY: &str = "Paris is the capital of France.";
const USER_2: &str = "And of Italy?";

fn sample(with_system: bool) -> Vec<ChatMessage> {
    let mut m = Vec::new();
    if with_system {
        m.push(ChatMessage::new("system", SYSTEM));
    }
    m.push(ChatMessage::new("user", USER_1));
    m.push(ChatMessage::new("assistant", REPLY));
    m.push(ChatMessage::new("user", USER_2));
    m
}

/// The chat-template checks; `override_source` is template source (or a built-in's name) to check in place of the
/// file's own.
pub fn check_all(
    md: &Metadata,
    tok: &Tokenizer,
    override_source: Option<&str>,
    limits: RenderLimits,
) -> TemplateChecks {
    let template = match ChatTemplate::from_metadata(md, override_source) {
        Ok(t) => t.with_limits(limits),
        Err(e) => return TemplateChecks::broken(format!("does not load: {e}")),
    };
    let own = template.name() == crate::tokenizer::keys::CHAT_TEMPLATE;
    let origin = if own {
        "the file's own".to_string()
    } else if override_source.is_some() {
        format!("'{}' (given)", template.name())
    } else {
        format!("built-in '{}' (the file has none)", template.name())
    };

    let mut details = Vec::new();
    let mut status = Status::Ok;
    if !own && override_source.is_none() {
        status = Status::Warn;
        details.push(
            "a file without a chat template is usually a base model, which may not follow a chat format; \
             `chat` and `serve` use the stand-in, --chat-template picks another"
                .into(),
        );
    }
    // With a system message first; templates that refuse one (some raise an error) are tried without.
    let (messages, rendered) = match template.render(&sample(true), true) {
        Ok(r) => (sample(true), r),
        Err(with_system) => match template.render(&sample(false), true) {
            Ok(r) => {
                status = status.max(Status::Warn);
                details.push(format!(
                    "refuses a system message ({with_system}): `chat --system` and API requests with one will fail"
                ));
                (sample(false), r)
            }
            Err(e) => return TemplateChecks::broken(format!("{origin}: does not render a conversation: {e}")),
        },
    };
    for m in &messages {
        if !rendered.contains(m.content.as_str()) {
            status = status.max(Status::Warn);
            details.push(format!("drops the {} message {:?} from the prompt", m.role, m.content));
        }
    }
    match template.render(&messages, false) {
        Ok(closed) if closed == rendered => {
            status = status.max(Status::Warn);
            details.push(
                "ignores add_generation_prompt: the prompt does not open the assistant's turn, so the model may \
                 go on writing the user's"
                    .into(),
            );
        }
        Ok(_) => {}
        Err(e) => {
            status = status.max(Status::Warn);
            details.push(format!("fails without a generation prompt: {e}"));
        }
    }
    let style = crate::tools::ToolStyle::of_template(template.source());
    if style == crate::tools::ToolStyle::Json {
        details.push(
            "tool calls: described in the system message as a JSON protocol (the template has no tool format)".into(),
        );
    } else {
        // The style is read from the source's words; the template must also write the tools it is given.
        let tools = serde_json::json!([{"type": "function", "function": {"name": "get_weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]);
        let calls_as = style.calls_as();
        match template.render_with_tools(&messages, Some(tools), true) {
            Ok(with) if with.contains("get_weather") => {
                details.push(format!("tool calls: as the template's own {calls_as} (it lists the tools itself)"));
            }
            Ok(_) => {
                status = status.max(Status::Warn);
                details.push(format!(
                    "tool calls: it teaches {calls_as} but does not write the tools it is given, so a `serve` \
                     request's tools never reach the model"
                ));
            }
            Err(e) => {
                status = status.max(Status::Warn);
                details.push(format!("tool calls: it fails to render a conversation with tools: {e}"));
            }
        }
    }
    let n_tokens = tok.encode_prompt(&rendered).len();
    let summary = format!("{origin}: renders a {}-message conversation ({n_tokens} tokens)", messages.len());
    TemplateChecks {
        checks: vec![Check::new("chat template", status, summary).with_details(details), end_of_turn(&template, tok)],
        sample: Some(rendered),
    }
}

/// What a template writes right after a finished reply.
enum TurnEnd {
    /// A special token that ends generation.
    Ends(u32),
    /// A special token that does not.
    RunsOn(u32),
    /// Nothing at all: the model must end the reply with EOS itself.
    Nothing,
    /// Plain text, no special token.
    Text(String),
    /// The template could not show it (the message says why).
    Unknown(String),
}

/// What the template writes after a finished reply, up to its first special token.
fn turn_end(template: &ChatTemplate, tok: &Tokenizer) -> TurnEnd {
    let messages = [ChatMessage::new("user", USER_1), ChatMessage::new("assistant", REPLY)];
    let rendered = match template.render(&messages, false) {
        Ok(r) => r,
        Err(e) => return TurnEnd::Unknown(format!("a conversation ending in a reply does not render: {e}")),
    };
    let Some(at) = rendered.rfind(REPLY) else {
        return TurnEnd::Unknown("the rendered reply is not in the prompt".into());
    };
    let tail = &rendered[at + REPLY.len()..];
    let special = tok
        .encode(tail, false, true)
        .into_iter()
        .find(|&id| matches!(tok.token_type(id), Some(TokenType::Control | TokenType::UserDefined)) || tok.is_eog(id));
    match special {
        Some(id) if tok.is_eog(id) => TurnEnd::Ends(id),
        Some(id) => TurnEnd::RunsOn(id),
        None if tail.trim().is_empty() => TurnEnd::Nothing,
        None => TurnEnd::Text(tail.to_string()),
    }
}

/// The token a template ends turns with when it does not end generation, for a warning where a chat starts.
pub fn turn_token_that_runs_on(template: &ChatTemplate, tok: &Tokenizer) -> Option<u32> {
    match turn_end(template, tok) {
        TurnEnd::RunsOn(id) => Some(id),
        _ => None,
    }
}

/// Whether a finished reply ends with a token that ends generation. When it does not, a model that ends its turn
/// the way the template taught it keeps writing (mistral.rs #1012, #1147).
fn end_of_turn(template: &ChatTemplate, tok: &Tokenizer) -> Check {
    let name = "end of turn";
    let what = super::vocab::describe;
    match turn_end(template, tok) {
        TurnEnd::Ends(id) => Check::ok(name, format!("a reply ends with {}, which ends generation", what(tok, id))),
        TurnEnd::RunsOn(id) => {
            Check::fail(name, format!("a reply ends with {}, which does not end generation", what(tok, id)))
                .with_details(vec![format!(
                    "the model ends its turns with this token, and generation goes on past it into text of its \
                     own making; until the file is fixed, pass --stop {:?}",
                    tok.token_text(id).unwrap_or("?")
                )])
        }
        TurnEnd::Nothing => match tok.eos() {
            Some(eos) => Check::ok(
                name,
                format!("the template writes nothing after a reply; the model ends it with EOS {}", what(tok, eos)),
            ),
            None => {
                Check::fail(name, "the template writes nothing after a reply and there is no EOS: nothing ends one")
            }
        },
        TurnEnd::Text(tail) => Check::warn(name, format!("a reply ends with plain text {tail:?}, not a special token"))
            .with_details(vec![format!(
                "generation ends only at an end-of-generation token; if the model writes this text instead, \
                 pass --stop {:?}",
                tail.trim()
            )]),
        TurnEnd::Unknown(why) => Check::warn(name, format!("cannot tell: {why}")),
    }
}
