//! Structured output: constraining generation so the text is valid JSON, of a given JSON schema or any object, or
//! text of a GBNF grammar ([`grammar`], [`grammar_machine`]).
//!
//! At each step a [`JsonConstraint`] computes which tokens can extend the text so far towards a valid JSON value
//! of the schema ([`schema`], [`schema_machine`]; OpenAI's `json_object` format is the schema `{"type": "object"}`)
//! (a bit mask over the vocabulary), the sampler draws only among those ([`crate::sampling::Sampler::sample_masked`]:
//! the mask applies after the repeat penalty and before top-k, top-p, min-p and temperature, so the distribution is
//! the model's, renormalized over the allowed tokens), and the chosen token's bytes advance the machine. Generation
//! ends when the value closes.
//!
//! A mask is one walk over the vocabulary in byte order ([`vocab::SortedVocab::fill_mask`], tens of microseconds
//! with its shortcuts); the last few masks are kept with the state each is for, and a long string repeats one state
//! token after token, so most steps inside strings reuse one.

pub mod grammar;
pub mod grammar_machine;
pub mod json;
pub mod native_calls;
pub mod schema;
pub mod schema_machine;
pub mod vocab;

use std::sync::{Arc, OnceLock};

use serde::{Deserialize, Serialize};

pub use grammar::{Grammar, GrammarError};
pub use grammar_machine::{GrammarConstraint, GrammarMachine};
pub use json::JsonMachine;
pub use native_calls::{NativeCalls, NativeCallsConstraint};
pub use schema::{JsonSchema, SchemaError};
pub use schema_machine::SchemaMachine;
pub use vocab::SortedVocab;

/// What shape the generated text must have.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OutputFormat {
    /// Free text.
    #[default]
    Text,
    /// One JSON object, and nothing after it.
    JsonObject,
    /// One JSON value of this schema, and nothing after it.
    JsonSchema(Arc<JsonSchema>),
    /// Text of this GBNF grammar (from its rule `root`).
    Grammar(Arc<Grammar>),
    /// Tool calls in a chat template's own format (set by [`crate::tools`] for a request's tools;
    /// no command line or file names it).
    #[serde(skip)]
    NativeCalls(Arc<NativeCalls>),
}

impl OutputFormat {
    /// The name a user types (`--format`, `/set format`): `text` or `json`; `json-schema` for a schema (given with
    /// `--json-schema`).
    pub fn name(&self) -> &'static str {
        match self {
            OutputFormat::Text => "text",
            OutputFormat::JsonObject => "json",
            OutputFormat::JsonSchema(_) => "json-schema",
            OutputFormat::Grammar(_) => "grammar",
            OutputFormat::NativeCalls(_) => "tool-calls",
        }
    }

    /// The schema generation follows, if the text must be JSON.
    pub fn schema(&self) -> Option<Arc<JsonSchema>> {
        match self {
            OutputFormat::Text | OutputFormat::Grammar(_) | OutputFormat::NativeCalls(_) => None,
            OutputFormat::JsonObject => Some(JsonSchema::any_object()),
            OutputFormat::JsonSchema(s) => Some(s.clone()),
        }
    }

    /// The format a user named ([`name`](Self::name)'s inverse).
    pub fn from_name(name: &str) -> Option<OutputFormat> {
        [OutputFormat::Text, OutputFormat::JsonObject].into_iter().find(|f| f.name() == name)
    }
}

/// Masks kept per constraint: the states of a string's inside, of the places between values, and a spare.
const CACHED_MASKS: usize = 4;

/// The masks of the states a constraint met most recently ([`CACHED_MASKS`] of them): a long string repeats one
/// state token after token, so most steps inside strings reuse one.
#[derive(Debug)]
pub(crate) struct MaskCache<M> {
    /// The most recent last.
    entries: Vec<(M, Vec<u64>)>,
}

impl<M: Copy + PartialEq> MaskCache<M> {
    pub(crate) fn new() -> MaskCache<M> {
        MaskCache { entries: Vec::with_capacity(CACHED_MASKS) }
    }

    /// Whether the mask of `state` is kept.
    pub(crate) fn has(&self, state: M) -> bool {
        self.entries.iter().any(|(m, _)| *m == state)
    }

    pub(crate) fn clear(&mut self) {
        self.entries.clear();
    }

    /// The mask of `state`: the one kept, or one `fill` computes (into the oldest one's buffer, once all are in use).
    pub(crate) fn get(&mut self, state: M, fill: impl FnOnce(&mut Vec<u64>)) -> &[u64] {
        let at = match self.entries.iter().position(|(m, _)| *m == state) {
            Some(at) => at,
            None => {
                let mut mask = if self.entries.len() == CACHED_MASKS { self.entries.remove(0).1 } else { Vec::new() };
                fill(&mut mask);
                self.entries.push((state, mask));
                self.entries.len() - 1
            }
        };
        &self.entries[at].1
    }
}

/// One sequence's JSON constraint: the schema, the machine, and masks of the states it met recently.
#[derive(Debug)]
pub struct JsonConstraint {
    vocab: Arc<SortedVocab>,
    schema: Arc<JsonSchema>,
    machine: SchemaMachine,
    cache: MaskCache<SchemaMachine>,
    states: Vec<SchemaMachine>,
}

/// A token the constraint did not allow was fed to it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("token {token} cannot continue the constrained text (JSON or grammar) at this point")]
pub struct Refused {
    pub token: u32,
}

/// One sequence's constraint on its text, whichever the format asks for.
#[derive(Debug)]
pub enum Constraint {
    Json(JsonConstraint),
    Grammar(GrammarConstraint),
    Native(NativeCallsConstraint),
}

impl Constraint {
    /// The constraint `format` asks for (none for free text). `vocab` holds the vocabulary in byte order, built by
    /// the first constrained request and shared after.
    pub fn new(
        format: &OutputFormat,
        vocab: &OnceLock<Arc<SortedVocab>>,
        tokenizer: &crate::tokenizer::Tokenizer,
    ) -> Option<Constraint> {
        let vocab = || vocab.get_or_init(|| Arc::new(SortedVocab::new(tokenizer))).clone();
        match format {
            OutputFormat::Text => None,
            OutputFormat::Grammar(g) => Some(Constraint::Grammar(GrammarConstraint::new(vocab(), g.clone()))),
            OutputFormat::NativeCalls(t) => Some(Constraint::Native(NativeCallsConstraint::new(vocab(), t.clone()))),
            _ => format.schema().map(|schema| Constraint::Json(JsonConstraint::new(vocab(), schema))),
        }
    }

    /// The tokens allowed next, as a bit mask over the vocabulary (bit `id % 64` of word `id / 64`).
    pub fn mask(&mut self) -> &[u64] {
        match self {
            Constraint::Json(c) => c.mask(),
            Constraint::Grammar(c) => c.mask(),
            Constraint::Native(c) => c.mask(),
        }
    }

    /// Advances past `token`'s bytes (`bytes`, as the tokenizer decodes it), which must be allowed.
    pub fn accept(&mut self, token: u32, bytes: &[u8]) -> Result<(), Refused> {
        match self {
            Constraint::Json(c) => c.accept(token, bytes),
            Constraint::Grammar(c) => c.accept(token, bytes),
            Constraint::Native(c) => c.accept(token, bytes),
        }
    }

    /// Whether the constrained text is finished (generation should end).
    pub fn is_complete(&self) -> bool {
        match self {
            Constraint::Json(c) => c.is_complete(),
            Constraint::Grammar(c) => c.is_complete(),
            Constraint::Native(c) => c.is_complete(),
        }
    }

    /// What to say when sampling found no allowed token: `why` (the sampler's error), with the grammar's account
    /// of its dead end where it has one.
    pub fn explain(&mut self, why: &crate::sampling::SamplingError) -> String {
        match (self, why) {
            (Constraint::Grammar(c), crate::sampling::SamplingError::NothingAllowed) => c.dead_end(),
            _ => why.to_string(),
        }
    }
}

impl JsonConstraint {
    pub fn new(vocab: Arc<SortedVocab>, schema: Arc<JsonSchema>) -> JsonConstraint {
        JsonConstraint {
            vocab,
            machine: SchemaMachine::new(&schema),
            schema,
            cache: MaskCache::new(),
            states: Vec::new(),
        }
    }

    /// The tokens allowed next, as a bit mask over the vocabulary (bit `id % 64` of word `id / 64`). All zero once
    /// the object is complete.
    pub fn mask(&mut self) -> &[u64] {
        let (schema, machine, vocab, states) = (&*self.schema, &self.machine, &self.vocab, &mut self.states);
        self.cache.get(self.machine, |mask| {
            let plain = machine.plain_string(schema);
            vocab.fill_mask(machine, plain, |m, b| m.step(schema, b), mask, states);
        })
    }

    /// Advances past `token`'s bytes (`bytes`, as the tokenizer decodes it), which must be allowed.
    pub fn accept(&mut self, token: u32, bytes: &[u8]) -> Result<(), Refused> {
        let mut next = self.machine;
        if bytes.is_empty() || !next.feed(&self.schema, bytes) {
            return Err(Refused { token });
        }
        self.machine = next;
        Ok(())
    }

    /// Whether the value has closed (generation should end).
    pub fn is_complete(&self) -> bool {
        self.machine.is_complete()
    }
}
