//! `infer chat [MODEL]`: an interactive conversation, a thin adapter over [`crate::chat::Chat`].
//!
//! On a terminal: line editing and persistent history (rustyline), a prompt that shows the context budget, colours
//! (unless `NO_COLOR` is set), and Ctrl-C that stops a reply. With stdin not a terminal, one message per line (a
//! `"""` block counts as one), no prompt, banner or colours: each reply goes to stdout followed by a blank line
//! (or, with `--json`, as one JSON object per line), and the command exits 0 at the end of input.

mod commands;
mod input;
mod terminal;

use std::io::{BufRead, IsTerminal, Read};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::{Args, ValueEnum};

use crate::chat::{Chat, ChatError, ChatSettings, OnFull, Reply};
use crate::cli::EngineArgs;
use crate::cli::args::{DraftArgs, FormatArgs, LengthArgs, SamplingArgs, StopArgs, ThreadArgs};
use crate::cli::output::{eprintln_lossy, print_flush, print_line};
use crate::cli::run::{generation_json, timing_line};
use crate::session::{FinishReason, GenerateError, Session};

use commands::Command;
use input::{Input, LineReader};
use terminal::Style;

#[derive(Args, Debug)]
pub struct ChatArgs {
    /// Model: a .gguf path or a registry name (default: the registry's default model, fetched on first use).
    pub model: Option<String>,
    /// A system prompt (/system changes it).
    #[arg(long, value_name = "TEXT")]
    pub system: Option<String>,
    /// A Jinja chat template file, or a built-in name (chatml, gemma, ...), instead of the model's own.
    #[arg(long = "chat-template", value_name = "FILE|NAME")]
    pub chat_template: Option<String>,
    /// When a message and the reply's reserve do not fit: drop the oldest exchanges, or refuse the message.
    #[arg(long = "on-full", value_enum, value_name = "POLICY", default_value_t = OnFullArg::Drop)]
    pub on_full: OnFullArg,
    /// Neither read nor write the input history ($INFER_HOME/history).
    #[arg(long)]
    pub no_history: bool,
    /// Print one JSON object per reply (the fields of `run --json`) instead of the text.
    #[arg(long)]
    pub json: bool,
    /// Print each reply's timing line on stderr.
    #[arg(short = 'v', long)]
    pub verbose: bool,
    #[command(flatten)]
    pub length: LengthArgs,
    #[command(flatten)]
    pub sampling: SamplingArgs,
    #[command(flatten)]
    pub format: FormatArgs,
    #[command(flatten)]
    pub stop: StopArgs,
    #[command(flatten)]
    pub draft: DraftArgs,
    #[command(flatten)]
    pub threads: ThreadArgs,
    #[command(flatten)]
    pub engine: EngineArgs,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum OnFullArg {
    /// Drop the oldest exchanges (never the system prompt) and say how many.
    Drop,
    /// Refuse the message, with the numbers.
    Error,
}

/// Longest line read from a pipe; a message that long is far beyond any context.
const MAX_LINE: usize = 16 << 20;

pub fn run(args: ChatArgs) -> anyhow::Result<()> {
    let params = args.sampling.to_params();
    params.validate()?;
    let dry_breakers = args.sampling.dry_breakers().map_err(anyhow::Error::msg)?;
    let settings = ChatSettings {
        format: args.format.output_format(),
        ..ChatSettings::from_params(&params, args.sampling.seed, args.length.max_tokens())
    };
    let interactive = std::io::stdin().is_terminal();

    let load_start = Instant::now();
    let loaded = super::load(args.model.as_deref(), &args.engine)?;
    let (model, tokenizer) = (&loaded.model, &loaded.tokenizer);
    let load_time = load_start.elapsed();
    let template = super::chat_template(model, args.chat_template.as_deref())?;
    let template_notes =
        super::template_notes(model, tokenizer, args.chat_template.as_deref(), &template, &args.stop.stop);
    let n_ctx = args.length.n_ctx(model.config.n_ctx_train);
    super::check_context(model, n_ctx, args.engine.kv_dtype())?;
    let session = Session::new(model, tokenizer, n_ctx, args.engine.kv_dtype());
    let mut chat = Chat::new(session, tokenizer, template, args.system.clone(), settings);
    chat.stop = args.stop.stop.clone();
    chat.logit_bias = args.sampling.logit_bias();
    chat.dry_breakers = dry_breakers;
    chat.draft = args.draft.params();
    chat.on_full = match args.on_full {
        OnFullArg::Drop => OnFull::DropOldest,
        OnFullArg::Error => OnFull::Error,
    };

    let mut repl = Repl {
        chat,
        pool: args.threads.build_pool().context("starting worker threads")?,
        // On a terminal the handler goes in after the line editor, which takes SIGINT for itself (see terminal.rs).
        cancel: if interactive { Arc::new(AtomicBool::new(false)) } else { super::cancel_on_ctrl_c() },
        style: Style::new(interactive && std::io::stdout().is_terminal()),
        interactive,
        json: args.json,
        verbose: args.verbose,
        load_time,
        threads: args.threads.count(),
    };
    for note in &template_notes {
        eprintln_lossy!("{note}");
    }
    if interactive {
        let history = (!args.no_history).then(|| crate::registry::infer_home().join("history"));
        let banner = banner(&loaded.path, model, n_ctx, repl.threads, args.threads.reason());
        terminal::run(&mut repl, &banner, history)
    } else {
        repl.piped()
    }
}

/// The first lines on a terminal: the model, the context, where help is.
fn banner(path: &std::path::Path, model: &crate::model::Model, n_ctx: usize, threads: usize, why: &str) -> String {
    let name = path.file_name().map_or_else(|| path.display().to_string(), |n| n.to_string_lossy().into_owned());
    let arch = model.file().metadata().opt_str("general.architecture").ok().flatten().unwrap_or("?").to_string();
    format!(
        "infer chat with {name} ({arch}): context {n_ctx} tokens, {threads} threads ({why}), {}\n\
         /help lists the commands; \"\"\" starts a message of several lines; Ctrl-D leaves.",
        crate::cli::isa_in_use()
    )
}

/// What the loop does after an input.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Flow {
    Go,
    Exit,
}

/// Which reply to generate.
enum Turn<'a> {
    Send(&'a str),
    Regen,
}

/// The REPL's state, shared by the terminal and the piped loop.
pub struct Repl<'m> {
    chat: Chat<'m>,
    pool: rayon::ThreadPool,
    cancel: Arc<AtomicBool>,
    style: Style,
    interactive: bool,
    json: bool,
    verbose: bool,
    load_time: Duration,
    threads: usize,
}

impl Repl<'_> {
    /// The prompt: the context budget, e.g. `[412/8192] > `.
    fn prompt(&self) -> String {
        let used = self.chat.usage().map(|u| u.used()).unwrap_or(0);
        format!("[{used}/{}] > ", self.chat.n_ctx())
    }

    /// A line on stderr for a person: said only on a terminal.
    fn note(&self, text: &str) {
        if self.interactive {
            eprintln_lossy!("{}", self.style.dim(text));
        }
    }

    /// A note that is said in every mode (the context policy at work, an interrupted reply).
    fn warn(&self, text: &str) {
        eprintln_lossy!("{}", self.style.dim(text));
    }

    /// One line of error; the REPL goes on.
    fn error(&self, text: &str) {
        eprintln_lossy!("{}", self.style.red(&format!("error: {text}")));
    }

    /// Reads messages and commands from piped stdin until its end.
    fn piped(&mut self) -> anyhow::Result<()> {
        let mut stdin = std::io::stdin().lock();
        let mut reader = LineReader::new();
        let mut buf = Vec::new();
        for lineno in 1.. {
            buf.clear();
            let n = (&mut stdin).take(MAX_LINE as u64 + 1).read_until(b'\n', &mut buf).context("reading stdin")?;
            if n == 0 {
                break;
            }
            if buf.len() > MAX_LINE && buf.last() != Some(&b'\n') {
                self.error(&format!("stdin line {lineno} is longer than {MAX_LINE} bytes; skipped"));
                skip_line(&mut stdin)?;
                continue;
            }
            let Ok(line) = std::str::from_utf8(&buf) else {
                self.error(&format!("stdin line {lineno} is not valid UTF-8; skipped"));
                continue;
            };
            let line = line.strip_suffix('\n').unwrap_or(line);
            if let Some(input) = reader.feed(line)
                && self.handle(input)? == Flow::Exit
            {
                return Ok(());
            }
        }
        if let Some(input) = reader.finish() {
            self.warn("note: the \"\"\" block was not closed; sending it as it is");
            self.handle(input)?;
        }
        Ok(())
    }

    /// Acts on one input. Mistakes are reported and the REPL goes on; only a failure to write the output ends it.
    fn handle(&mut self, input: Input) -> anyhow::Result<Flow> {
        match input {
            Input::Message(text) => self.reply(Turn::Send(&text)),
            Input::Command(line) => match commands::parse(&line) {
                Ok(command) => self.command(command),
                Err(e) => {
                    self.error(&e);
                    Ok(Flow::Go)
                }
            },
        }
    }

    fn command(&mut self, command: Command) -> anyhow::Result<Flow> {
        match command {
            Command::Help => print_line(commands::HELP)?,
            Command::Exit => return Ok(Flow::Exit),
            Command::Clear => {
                self.chat.clear();
                self.note("(a new conversation; the system prompt stays)");
            }
            Command::System(None) => match self.chat.conversation().system() {
                Some(s) => print_line(s)?,
                None => self.note("(no system prompt)"),
            },
            Command::System(Some(text)) => {
                self.chat.set_system(Some(text));
                self.note("(system prompt set)");
            }
            Command::Regen => return self.reply(Turn::Regen),
            Command::Undo => match self.chat.undo() {
                Ok(e) => self.note(&format!("(dropped your message \"{}\" and its reply)", preview(&e.user))),
                Err(e) => self.error(&e.to_string()),
            },
            Command::Save(path) => match self.chat.save(&path) {
                Ok(()) => self.note(&format!("(saved to {})", path.display())),
                Err(e) => self.error(&e.to_string()),
            },
            Command::Load(path) => match self.chat.load(&path) {
                Ok(()) => {
                    let n = self.chat.conversation().exchanges().len();
                    self.note(&format!("(loaded {n} exchanges and the settings from {})", path.display()));
                }
                Err(e) => self.error(&e.to_string()),
            },
            Command::Set(None) => print_line(&commands::show(&self.chat.settings))?,
            Command::Set(Some((key, value))) => match commands::set(&mut self.chat.settings, &key, &value) {
                Ok(()) => self.note(&format!("({key} = {value})")),
                Err(e) => self.error(&e),
            },
            Command::Context => match self.chat.usage() {
                Ok(u) => print_line(&format!(
                    "system {} + history {} + reply reserve {} + free {} = context {} tokens",
                    u.system, u.history, u.reserve, u.free, u.n_ctx
                ))?,
                Err(e) => self.error(&e.to_string()),
            },
            Command::Stats => match self.chat.last_stats() {
                Some(s) => {
                    let t = &s.timings;
                    let ttft = t.first_token.map_or("-".to_string(), |d| format!("{:.0} ms", d.as_secs_f64() * 1e3));
                    print_line(&format!(
                        "prompt {} tokens ({} new), {:.1} t/s | generation {} tokens, {:.1} t/s | first token after {ttft} | seed {}",
                        s.prompt_tokens,
                        t.prompt_tokens,
                        t.prompt_tps(),
                        t.generated_tokens,
                        t.generate_tps(),
                        s.seed
                    ))?
                }
                None => self.note("(no reply yet)"),
            },
        }
        Ok(Flow::Go)
    }

    /// Generates a reply, streaming it to stdout (or printing its JSON object), then says what the user should
    /// know: turns dropped to make room, an interruption, a full context.
    fn reply(&mut self, turn: Turn<'_>) -> anyhow::Result<Flow> {
        if let Turn::Send(text) = turn {
            match self.chat.make_room(text) {
                Ok(0) => {}
                Ok(n) => self.warn(&format!(
                    "note: the context is full: dropped the {n} oldest exchange{} (the system prompt stays)",
                    if n == 1 { "" } else { "s" }
                )),
                Err(e) => {
                    self.error(&e.to_string());
                    return Ok(Flow::Go);
                }
            }
        }
        // Piped, a Ctrl-C ends the chat, also one that came between replies; on a terminal it only stops a reply.
        if !self.interactive && self.cancel.load(Ordering::SeqCst) {
            self.warn("note: interrupted");
            return Ok(Flow::Exit);
        }
        let (chat, cancel, json, interactive) = (&mut self.chat, &*self.cancel, self.json, self.interactive);
        let mut last = None;
        if interactive {
            cancel.store(false, Ordering::SeqCst);
        }
        let result = self.pool.install(|| {
            let mut on_text = |text: &str| {
                if !json && !text.is_empty() {
                    last = text.chars().last();
                    print_flush(text)?;
                }
                Ok(())
            };
            match turn {
                Turn::Send(text) => chat.send(text, cancel, &mut on_text),
                Turn::Regen => chat.regenerate(cancel, &mut on_text),
            }
        });
        if interactive {
            cancel.store(false, Ordering::SeqCst);
        }
        let reply = match result {
            Ok(reply) => reply,
            // stdout is gone: nothing more can be shown.
            Err(ChatError::Generate(GenerateError::Output(e))) => return Err(e.into()),
            Err(e) => {
                if last.is_some() {
                    print_flush("\n")?;
                }
                self.error(&e.to_string());
                return Ok(Flow::Go);
            }
        };
        self.finish_reply(&reply, last)
    }

    fn finish_reply(&mut self, reply: &Reply, last: Option<char>) -> anyhow::Result<Flow> {
        let g = &reply.generation;
        if self.json {
            print_line(&generation_json(g, reply.seed, reply.prompt_tokens, self.load_time, self.threads).to_string())?;
        } else {
            // The reply ends its line, then a blank line parts it from what comes next.
            print_flush(if last.is_none_or(|c| c == '\n') { "\n" } else { "\n\n" })?;
        }
        if g.context_full {
            self.warn(&format!(
                "note: the context ({} tokens) is full: the reply stopped there; the next message drops old exchanges \
                 or is refused (--on-full)",
                self.chat.n_ctx()
            ));
        }
        if self.verbose {
            eprintln_lossy!("{}", self.style.dim(&timing_line(None, &g.timings, self.threads, reply.seed)));
        }
        if g.finish == FinishReason::Cancelled {
            if !self.interactive {
                self.warn("note: interrupted");
                return Ok(Flow::Exit);
            }
            self.note("(interrupted: the reply so far is kept)");
        }
        Ok(Flow::Go)
    }
}

/// Reads and drops the rest of an over-long line.
fn skip_line(stdin: &mut impl BufRead) -> anyhow::Result<()> {
    let mut sink = Vec::new();
    loop {
        sink.clear();
        let n = stdin.take(1 << 20).read_until(b'\n', &mut sink).context("reading stdin")?;
        if n == 0 || sink.last() == Some(&b'\n') {
            return Ok(());
        }
    }
}

/// The start of a message, for a note.
fn preview(text: &str) -> String {
    const MAX: usize = 40;
    let line = text.lines().next().unwrap_or("");
    match line.char_indices().nth(MAX) {
        Some((i, _)) => format!("{}…", &line[..i]),
        None if line.len() < text.len() => format!("{line}…"),
        None => line.to_string(),
    }
}
