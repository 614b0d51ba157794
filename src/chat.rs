//! A chat over a [`Session`]: the conversation (system prompt and whole exchanges), its rendering with the model's
//! chat template, the context's token budget and what happens when it fills, and saving and loading as JSON.
//!
//! Nothing here knows about terminals: the `infer chat` REPL is a thin adapter over [`Chat`], and a program can
//! drive a chat the same way.
//!
//! Every turn renders the whole conversation and tokenizes it, so the prompt is always the template's canonical
//! form (the same tokens whether the conversation was typed, regenerated or loaded from a file). The [`Session`]
//! keeps the cache of the previous turn and runs only the tokens past the common prefix: the reply it generated
//! (when it tokenizes back to the same ids, which is the usual case) and the new message.

use std::path::Path;
use std::sync::atomic::AtomicBool;

use serde::{Deserialize, Serialize};

use crate::sampling::{
    DryParams, DynatempParams, LogitBias, MirostatParams, SamplerOrder, SamplingError, SamplingParams, XtcParams,
    random_seed,
};
use crate::session::{GenerateError, GenerateRequest, Generation, Session, Timings};
use crate::speculative::DraftParams;
use crate::structured::OutputFormat;
use crate::tokenizer::Tokenizer;
use crate::tokenizer::chat::{ChatMessage, ChatTemplate, TemplateError};

/// The reply reserve when no reply length is set: room kept free for the answer when deciding whether a message
/// fits (capped at half the context).
pub const DEFAULT_RESERVE: usize = 512;

/// Largest conversation file `load` reads.
pub const MAX_FILE_BYTES: u64 = 64 << 20;

/// One user message and the assistant's reply to it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Exchange {
    pub user: String,
    pub assistant: String,
}

/// A system prompt and the exchanges after it. Messages always alternate user, assistant, so every template that
/// insists on alternation accepts them, and dropping or undoing removes whole exchanges.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Conversation {
    system: Option<String>,
    exchanges: Vec<Exchange>,
}

/// What to do when a new message and the reply reserve do not fit beside the conversation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnFull {
    /// Drop the oldest exchanges (never the system prompt) until they fit.
    DropOldest,
    /// Refuse the message.
    Error,
}

/// Sampling settings of a chat, as `/set` changes them and a saved conversation stores them.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ChatSettings {
    pub temperature: f32,
    pub top_k: usize,
    pub top_p: f32,
    pub min_p: f32,
    /// Top-nσ (≤ 0 = off).
    pub top_n_sigma: f32,
    pub repeat_penalty: f32,
    pub repeat_last_n: usize,
    pub presence_penalty: f32,
    pub frequency_penalty: f32,
    /// DRY's repeat penalty (off unless its multiplier is above 0).
    pub dry: DryParams,
    /// XTC (off unless its probability is above 0).
    pub xtc: XtcParams,
    /// Locally typical sampling's mass (1 = off).
    pub typical_p: f32,
    /// Dynamic temperature (off unless its range is above 0).
    pub dynatemp: DynatempParams,
    /// Mirostat (off unless its version is 1 or 2).
    pub mirostat: MirostatParams,
    /// The order of the sampling steps (`--samplers`).
    pub samplers: SamplerOrder,
    /// A fixed seed makes replies reproducible; `None` picks a fresh one per reply.
    pub seed: Option<u64>,
    /// Most tokens per reply; `None` = until the model ends its turn or the context is full.
    pub max_tokens: Option<usize>,
    /// The shape of each reply (`json`: one JSON object).
    pub format: OutputFormat,
}

impl Default for ChatSettings {
    fn default() -> Self {
        ChatSettings::from_params(&SamplingParams::DEFAULT, None, None)
    }
}

impl ChatSettings {
    pub fn from_params(p: &SamplingParams, seed: Option<u64>, max_tokens: Option<usize>) -> ChatSettings {
        ChatSettings {
            temperature: p.temperature,
            top_k: p.top_k,
            top_p: p.top_p,
            min_p: p.min_p,
            top_n_sigma: p.top_n_sigma,
            repeat_penalty: p.repeat_penalty,
            repeat_last_n: p.repeat_last_n,
            presence_penalty: p.presence_penalty,
            frequency_penalty: p.frequency_penalty,
            dry: p.dry,
            xtc: p.xtc,
            typical_p: p.typical_p,
            dynatemp: p.dynatemp,
            mirostat: p.mirostat,
            samplers: p.samplers,
            seed,
            max_tokens,
            format: OutputFormat::Text,
        }
    }

    /// The sampling parameters of one reply, drawn with `seed`.
    pub fn params(&self, seed: u64) -> SamplingParams {
        SamplingParams {
            temperature: self.temperature,
            top_k: self.top_k,
            top_p: self.top_p,
            min_p: self.min_p,
            top_n_sigma: self.top_n_sigma,
            repeat_penalty: self.repeat_penalty,
            repeat_last_n: self.repeat_last_n,
            presence_penalty: self.presence_penalty,
            frequency_penalty: self.frequency_penalty,
            dry: self.dry,
            xtc: self.xtc,
            typical_p: self.typical_p,
            dynatemp: self.dynatemp,
            mirostat: self.mirostat,
            seed,
            samplers: self.samplers,
        }
    }

    pub fn validate(&self) -> Result<(), SamplingError> {
        self.params(0).validate()
    }
}

/// A saved conversation: the OpenAI `messages` shape (role and content; the system prompt, if any, first), plus
/// the sampling settings.
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct ChatFile {
    messages: Vec<ChatMessage>,
    #[serde(default)]
    settings: Option<ChatSettings>,
}

#[derive(Debug, thiserror::Error)]
pub enum ChatError {
    #[error("the message is empty")]
    EmptyMessage,
    #[error(
        "the message is {message} tokens; with the system prompt, the template and the {reserve}-token reply reserve \
         it needs {needed}, but the context holds {n_ctx}: nothing was sent"
    )]
    MessageTooLong { message: usize, needed: usize, reserve: usize, n_ctx: usize },
    #[error(
        "the context is full: the conversation and the message are {prompt} tokens, the reply reserve {reserve}, but \
         the context holds {n_ctx}: nothing was sent"
    )]
    ContextFull { prompt: usize, reserve: usize, n_ctx: usize },
    #[error("there is no reply to regenerate")]
    NothingToRegenerate,
    #[error("there is no exchange to undo")]
    NothingToUndo,
    #[error("{path}: {detail}")]
    File { path: String, detail: String },
    #[error(transparent)]
    Template(#[from] TemplateError),
    #[error(transparent)]
    Sampling(#[from] SamplingError),
    #[error(transparent)]
    Generate(#[from] GenerateError),
}

impl Conversation {
    pub fn new(system: Option<String>) -> Conversation {
        Conversation { system, exchanges: Vec::new() }
    }

    pub fn system(&self) -> Option<&str> {
        self.system.as_deref()
    }

    pub fn exchanges(&self) -> &[Exchange] {
        &self.exchanges
    }

    pub fn is_empty(&self) -> bool {
        self.exchanges.is_empty()
    }

    /// The messages to render: the system prompt (if any), then each exchange's user and assistant messages, then
    /// `pending` as a last user message.
    pub fn messages(&self, pending: Option<&str>) -> Vec<ChatMessage> {
        self.messages_from(0, pending)
    }

    /// As [`Conversation::messages`], leaving out the first `skip` exchanges.
    fn messages_from(&self, skip: usize, pending: Option<&str>) -> Vec<ChatMessage> {
        let mut out = Vec::with_capacity(2 * self.exchanges.len() + 2);
        if let Some(s) = &self.system {
            out.push(ChatMessage::new("system", s.clone()));
        }
        for e in self.exchanges.iter().skip(skip) {
            out.push(ChatMessage::new("user", e.user.clone()));
            out.push(ChatMessage::new("assistant", e.assistant.clone()));
        }
        if let Some(p) = pending {
            out.push(ChatMessage::new("user", p));
        }
        out
    }

    pub fn push(&mut self, user: impl Into<String>, assistant: impl Into<String>) {
        self.exchanges.push(Exchange { user: user.into(), assistant: assistant.into() });
    }

    /// Removes and returns the last exchange.
    pub fn pop(&mut self) -> Option<Exchange> {
        self.exchanges.pop()
    }

    /// Drops every exchange, keeping the system prompt.
    pub fn clear(&mut self) {
        self.exchanges.clear();
    }

    /// The conversation as JSON: `{"messages": [{"role", "content"}, ...], "settings": {...}}`.
    pub fn to_json(&self, settings: &ChatSettings) -> String {
        let file = ChatFile { messages: self.messages(None), settings: Some(settings.clone()) };
        serde_json::to_string_pretty(&file).expect("strings and numbers serialize")
    }

    /// Reads [`Conversation::to_json`]'s format. The roles must be an optional `system` first, then `user` and
    /// `assistant` in turn, ending with an assistant message; the settings, when present, must be valid.
    pub fn from_json(text: &str) -> Result<(Conversation, Option<ChatSettings>), String> {
        let file: ChatFile = serde_json::from_str(text).map_err(|e| format!("not a saved conversation: {e}"))?;
        if let Some(s) = &file.settings {
            s.validate().map_err(|e| format!("settings: {e}"))?;
        }
        let mut messages = file.messages.into_iter().enumerate().peekable();
        let system = messages.next_if(|(_, m)| m.role == "system").map(|(_, m)| m.content);
        let mut conversation = Conversation::new(system);
        while let Some((i, user)) = messages.next() {
            if user.role != "user" {
                return Err(format!("message {}: role '{}' where 'user' was expected", i + 1, user.role));
            }
            match messages.next() {
                Some((_, reply)) if reply.role == "assistant" => conversation.push(user.content, reply.content),
                Some((j, other)) => {
                    return Err(format!("message {}: role '{}' where 'assistant' was expected", j + 1, other.role));
                }
                None => return Err(format!("message {} (user) has no assistant reply after it", i + 1)),
            }
        }
        Ok((conversation, file.settings))
    }
}

/// How the context is spent, in tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ContextUsage {
    pub n_ctx: usize,
    /// The part that is never dropped: the template's opening and the system prompt, up to the first message's
    /// text.
    pub system: usize,
    /// The exchanges.
    pub history: usize,
    /// Kept free for the next reply (what is left of [`Chat::reserve`] when the conversation reaches into it).
    pub reserve: usize,
    /// What is left.
    pub free: usize,
}

impl ContextUsage {
    pub fn used(&self) -> usize {
        self.system + self.history
    }
}

/// One reply.
#[derive(Debug, Clone)]
pub struct Reply {
    pub generation: Generation,
    /// The seed it was drawn with.
    pub seed: u64,
    /// Tokens of the whole prompt: the rendered conversation up to the reply.
    pub prompt_tokens: usize,
    /// Exchanges dropped from the start of the conversation to make room for it.
    pub dropped: usize,
}

/// The figures of the last reply, for `/stats`.
#[derive(Debug, Clone, Copy)]
pub struct TurnStats {
    pub prompt_tokens: usize,
    pub timings: Timings,
    pub seed: u64,
}

/// A conversation with a model: a [`Session`] holding its cache, the chat template, the settings.
pub struct Chat<'m> {
    session: Session<'m>,
    tokenizer: &'m Tokenizer,
    template: ChatTemplate,
    conversation: Conversation,
    pub settings: ChatSettings,
    /// Stop strings for every reply.
    pub stop: Vec<String>,
    /// Biases on chosen tokens' logits, for every reply.
    pub logit_bias: LogitBias,
    /// DRY's sequence breakers for every reply (`None`: its defaults).
    pub dry_breakers: Option<Vec<String>>,
    /// Speculative decoding for every reply (the text is the same with or without it).
    pub draft: DraftParams,
    pub on_full: OnFull,
    last: Option<TurnStats>,
    /// How many times the last reply has been regenerated (a fixed seed moves on by one each time).
    regenerations: u64,
}

impl<'m> Chat<'m> {
    pub fn new(
        session: Session<'m>,
        tokenizer: &'m Tokenizer,
        template: ChatTemplate,
        system: Option<String>,
        settings: ChatSettings,
    ) -> Chat<'m> {
        Chat {
            session,
            tokenizer,
            template,
            conversation: Conversation::new(system),
            settings,
            stop: Vec::new(),
            logit_bias: LogitBias::default(),
            dry_breakers: None,
            draft: DraftParams::OFF,
            on_full: OnFull::DropOldest,
            last: None,
            regenerations: 0,
        }
    }

    pub fn conversation(&self) -> &Conversation {
        &self.conversation
    }

    pub fn template(&self) -> &ChatTemplate {
        &self.template
    }

    pub fn session(&self) -> &Session<'m> {
        &self.session
    }

    pub fn n_ctx(&self) -> usize {
        self.session.n_ctx()
    }

    /// The figures of the last reply.
    pub fn last_stats(&self) -> Option<&TurnStats> {
        self.last.as_ref()
    }

    /// Sets or removes the system prompt; the exchanges stay.
    pub fn set_system(&mut self, system: Option<String>) {
        self.conversation.system = system;
    }

    /// Starts a new conversation with the same system prompt. (The cache is rewound on the next reply.)
    pub fn clear(&mut self) {
        self.conversation.clear();
    }

    /// Drops the last exchange and returns it. The cache goes back to the conversation before it on the next reply.
    pub fn undo(&mut self) -> Result<Exchange, ChatError> {
        self.conversation.pop().ok_or(ChatError::NothingToUndo)
    }

    /// Tokens kept free for the reply when checking whether a message fits: the reply length if one is set, else
    /// [`DEFAULT_RESERVE`], and at most half the context.
    pub fn reserve(&self) -> usize {
        self.settings.max_tokens.unwrap_or(DEFAULT_RESERVE).min(self.n_ctx() / 2)
    }

    /// The tokens of `messages` rendered with the template.
    pub fn tokens(&self, messages: &[ChatMessage], add_generation_prompt: bool) -> Result<Vec<u32>, ChatError> {
        let text = self.template.render(messages, add_generation_prompt)?;
        Ok(self.tokenizer.encode_prompt(&text))
    }

    /// How the context is spent by the conversation as it stands.
    pub fn usage(&self) -> Result<ContextUsage, ChatError> {
        // The fixed part: what two conversations with different first messages share.
        let probe = |text: &str| {
            let mut c = Conversation::new(self.conversation.system.clone());
            c.push(text, "");
            self.tokens(&c.messages(None), false)
        };
        let (a, b) = (probe("A")?, probe("B")?);
        let fixed = a.iter().zip(&b).take_while(|(x, y)| x == y).count();
        let used = if self.conversation.is_empty() {
            fixed
        } else {
            self.tokens(&self.conversation.messages(None), false)?.len()
        };
        let system = fixed.min(used);
        let n_ctx = self.n_ctx();
        // After a long reply the conversation may reach into the reserve: what is left of it is what there is.
        let reserve = self.reserve().min(n_ctx.saturating_sub(used));
        Ok(ContextUsage { n_ctx, system, history: used - system, reserve, free: n_ctx.saturating_sub(used + reserve) })
    }

    /// Sends a user message and streams the reply to `on_text`. Makes room first as [`Chat::on_full`] says; a
    /// refused message leaves the conversation as it was. A reply cut short by `cancel` is kept as far as it went.
    pub fn send(
        &mut self,
        text: &str,
        cancel: &AtomicBool,
        on_text: &mut dyn FnMut(&str) -> std::io::Result<()>,
    ) -> Result<Reply, ChatError> {
        if text.trim().is_empty() {
            return Err(ChatError::EmptyMessage);
        }
        let dropped = self.make_room(text)?;
        self.regenerations = 0;
        let mut reply = self.reply_to(text, cancel, on_text)?;
        reply.dropped = dropped;
        self.conversation.push(text, reply.generation.text.clone());
        Ok(reply)
    }

    /// Generates the last reply again (with a fixed seed, the next seed each time).
    pub fn regenerate(
        &mut self,
        cancel: &AtomicBool,
        on_text: &mut dyn FnMut(&str) -> std::io::Result<()>,
    ) -> Result<Reply, ChatError> {
        let last = self.conversation.pop().ok_or(ChatError::NothingToRegenerate)?;
        self.regenerations += 1;
        match self.reply_to(&last.user, cancel, on_text) {
            Ok(reply) => {
                self.conversation.push(last.user, reply.generation.text.clone());
                Ok(reply)
            }
            Err(e) => {
                self.conversation.exchanges.push(last);
                Err(e)
            }
        }
    }

    /// Checks that `pending` and the reply reserve fit beside the conversation, dropping the oldest exchanges if
    /// the policy allows; returns how many were dropped. On an error nothing has changed. ([`Chat::send`] does this
    /// itself; a caller that wants to say what was dropped before the reply streams calls it first.)
    pub fn make_room(&mut self, pending: &str) -> Result<usize, ChatError> {
        let (n_ctx, reserve) = (self.n_ctx(), self.reserve());
        let alone = Conversation::new(self.conversation.system.clone());
        let needed = self.tokens(&alone.messages(Some(pending)), true)?.len() + reserve;
        if needed > n_ctx {
            let message = self.tokenizer.encode(pending, false, false).len();
            return Err(ChatError::MessageTooLong { message, needed, reserve, n_ctx });
        }
        // The message fits on its own, so dropping every exchange would make room: the loop ends.
        let mut drop = 0;
        loop {
            let prompt = self.tokens(&self.conversation.messages_from(drop, Some(pending)), true)?.len();
            if prompt + reserve <= n_ctx {
                break;
            }
            if self.on_full == OnFull::Error {
                return Err(ChatError::ContextFull { prompt, reserve, n_ctx });
            }
            drop += 1;
        }
        self.conversation.exchanges.drain(..drop);
        Ok(drop)
    }

    /// Generates the assistant's reply to the conversation followed by `user`.
    fn reply_to(
        &mut self,
        user: &str,
        cancel: &AtomicBool,
        on_text: &mut dyn FnMut(&str) -> std::io::Result<()>,
    ) -> Result<Reply, ChatError> {
        self.settings.validate()?;
        let prompt = self.tokens(&self.conversation.messages(Some(user)), true)?;
        if prompt.len() >= self.n_ctx() {
            // A loaded conversation can be longer than this context; a typed one was checked by `make_room`.
            return Err(ChatError::ContextFull { prompt: prompt.len(), reserve: self.reserve(), n_ctx: self.n_ctx() });
        }
        let seed = self.settings.seed.map_or_else(random_seed, |s| s.wrapping_add(self.regenerations));
        let req = GenerateRequest {
            max_tokens: self.settings.max_tokens.unwrap_or(usize::MAX),
            sampling: self.settings.params(seed),
            stop: self.stop.clone(),
            ignore_eos: false,
            format: self.settings.format.clone(),
            logit_bias: self.logit_bias.clone(),
            dry_breakers: self.dry_breakers.clone(),
            draft: self.draft,
            prompt,
        };
        let generation = self.session.generate(&req, cancel, on_text)?;
        self.last = Some(TurnStats { prompt_tokens: req.prompt.len(), timings: generation.timings, seed });
        Ok(Reply { generation, seed, prompt_tokens: req.prompt.len(), dropped: 0 })
    }

    /// Writes the conversation and the settings to `path` as JSON.
    pub fn save(&self, path: &Path) -> Result<(), ChatError> {
        std::fs::write(path, self.conversation.to_json(&self.settings) + "\n")
            .map_err(|e| ChatError::File { path: path.display().to_string(), detail: e.to_string() })
    }

    /// Replaces the conversation (and the settings, if the file has them) with the one saved in `path`. On an
    /// error nothing changes.
    pub fn load(&mut self, path: &Path) -> Result<(), ChatError> {
        let err = |detail: String| ChatError::File { path: path.display().to_string(), detail };
        let len = std::fs::metadata(path).map_err(|e| err(e.to_string()))?.len();
        if len > MAX_FILE_BYTES {
            return Err(err(format!("{len} bytes, more than the {MAX_FILE_BYTES}-byte limit")));
        }
        let bytes = std::fs::read(path).map_err(|e| err(e.to_string()))?;
        let text = String::from_utf8(bytes).map_err(|_| err("not valid UTF-8".into()))?;
        let (conversation, settings) = Conversation::from_json(&text).map_err(err)?;
        self.conversation = conversation;
        if let Some(s) = settings {
            self.settings = s;
        }
        self.regenerations = 0;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn conversation_json_round_trip_and_checks() {
        let mut c = Conversation::new(Some("Be brief.".into()));
        c.push("Hi", "Hello!");
        c.push("2+2?", "4");
        let settings = ChatSettings { seed: Some(7), max_tokens: Some(32), ..ChatSettings::default() };
        let json = c.to_json(&settings);
        let v: serde_json::Value = serde_json::from_str(&json).unwrap();
        assert_eq!(v["messages"][0]["role"], "system");
        assert_eq!(v["messages"][4]["content"], "4");
        assert_eq!(v["settings"]["seed"], 7);
        assert_eq!(Conversation::from_json(&json).unwrap(), (c, Some(settings)));

        let no_system = r#"{"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]}"#;
        let (c, s) = Conversation::from_json(no_system).unwrap();
        assert_eq!((c.system(), c.exchanges().len(), s), (None, 1, None));

        for (bad, needle) in [
            (r#"{"messages": [{"role": "assistant", "content": "a"}]}"#, "message 1: role 'assistant'"),
            (r#"{"messages": [{"role": "user", "content": "a"}]}"#, "message 1 (user) has no assistant reply"),
            (
                r#"{"messages": [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]}"#,
                "message 2: role 'user' where 'assistant'",
            ),
            (r#"{"messages": [], "settings": {"temperature": -1}}"#, "settings: invalid sampling parameter"),
            (r#"{"messages": [], "settings": {"temp": 1}}"#, "unknown field `temp`"),
            (r#"[1, 2]"#, "not a saved conversation"),
        ] {
            let e = Conversation::from_json(bad).unwrap_err();
            assert!(e.contains(needle), "{bad}: {e}");
        }
    }
}
