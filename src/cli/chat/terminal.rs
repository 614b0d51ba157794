//! The REPL on a terminal: rustyline's line editing and history, the prompt's colours, Ctrl-C at the prompt.

use std::borrow::Cow;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use rustyline::completion::Completer;
use rustyline::error::ReadlineError;
use rustyline::highlight::Highlighter;
use rustyline::hint::Hinter;
use rustyline::history::FileHistory;
use rustyline::validate::Validator;
use rustyline::{
    Cmd, ConditionalEventHandler, Config, Editor, Event, EventContext, EventHandler, Helper, KeyEvent, RepeatCount,
};

use super::input::LineReader;
use super::{Flow, Repl};
use crate::cli::output::print_flush;

/// ANSI colours, or plain text when they are off (not a terminal, or `NO_COLOR` set).
#[derive(Debug, Clone, Copy)]
pub struct Style {
    on: bool,
}

impl Style {
    /// Colours when `terminal` and `NO_COLOR` is unset or empty (no-color.org).
    pub fn new(terminal: bool) -> Style {
        Style { on: terminal && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty()) }
    }

    fn paint<'a>(&self, code: &str, text: &'a str) -> Cow<'a, str> {
        if self.on { Cow::Owned(format!("\x1b[{code}m{text}\x1b[0m")) } else { Cow::Borrowed(text) }
    }

    pub fn dim<'a>(&self, text: &'a str) -> Cow<'a, str> {
        self.paint("2", text)
    }

    pub fn red<'a>(&self, text: &'a str) -> Cow<'a, str> {
        self.paint("31", text)
    }

    pub fn bold<'a>(&self, text: &'a str) -> Cow<'a, str> {
        self.paint("1", text)
    }
}

/// The commands, for Tab completion.
const COMMANDS: &[&str] =
    &["/help", "/exit", "/clear", "/system ", "/regen", "/undo", "/save ", "/load ", "/set ", "/context", "/stats"];

/// rustyline's hooks: command completion and a coloured prompt.
struct ChatHelper {
    style: Style,
}

impl Completer for ChatHelper {
    type Candidate = String;

    fn complete(&self, line: &str, pos: usize, _: &rustyline::Context<'_>) -> rustyline::Result<(usize, Vec<String>)> {
        let typed = &line[..pos];
        if !typed.starts_with('/') || typed.contains(char::is_whitespace) {
            return Ok((pos, Vec::new()));
        }
        Ok((0, COMMANDS.iter().filter(|c| c.starts_with(typed)).map(|c| c.to_string()).collect()))
    }
}

impl Highlighter for ChatHelper {
    fn highlight_prompt<'b, 's: 'b, 'p: 'b>(&'s self, prompt: &'p str, _default: bool) -> Cow<'b, str> {
        match prompt.strip_suffix("> ") {
            Some(budget) if self.style.on => Cow::Owned(format!("{}{} ", self.style.dim(budget), self.style.bold(">"))),
            _ => self.style.dim(prompt),
        }
    }
}

impl Hinter for ChatHelper {
    type Hint = String;
}

impl Validator for ChatHelper {}

impl Helper for ChatHelper {}

/// Notes whether the line was empty when Ctrl-C was pressed (rustyline's `Interrupted` does not say), and lets
/// rustyline go on with its default: give up the line.
struct CtrlCProbe(Arc<AtomicBool>);

impl ConditionalEventHandler for CtrlCProbe {
    fn handle(&self, _: &Event, _: RepeatCount, _: bool, ctx: &EventContext<'_>) -> Option<Cmd> {
        self.0.store(ctx.line().is_empty(), Ordering::SeqCst);
        None
    }
}

/// Runs the REPL on the terminal until /exit, Ctrl-D, or Ctrl-C twice at an empty prompt.
pub fn run(repl: &mut Repl<'_>, banner: &str, history: Option<PathBuf>) -> anyhow::Result<()> {
    let config = Config::builder().auto_add_history(false).max_history_size(1000)?.build();
    let mut editor: Editor<ChatHelper, FileHistory> = Editor::with_config(config)?;
    editor.set_helper(Some(ChatHelper { style: repl.style }));
    // The editor installed its own SIGINT handler, which only wakes its key reader: replace it with ours, so that
    // Ctrl-C during a reply stops the reply. (At the prompt the terminal is raw and Ctrl-C is a key, not a signal.)
    repl.cancel = crate::cli::cancel_on_ctrl_c();
    let empty_line = Arc::new(AtomicBool::new(false));
    editor.bind_sequence(KeyEvent::ctrl('C'), EventHandler::Conditional(Box::new(CtrlCProbe(empty_line.clone()))));
    let history = history.and_then(|path| match open_history(&mut editor, &path) {
        Ok(()) => Some(path),
        Err(e) => {
            repl.warn(&format!("note: no input history this time: {}: {e}", path.display()));
            None
        }
    });

    println!("{}", repl.style.bold(banner));
    let mut reader = LineReader::new();
    // The lines of the input being read, which become one history entry.
    let mut lines: Vec<String> = Vec::new();
    let mut leaving = false;
    loop {
        let prompt = if reader.in_block() { "... ".to_string() } else { repl.prompt() };
        let line = match editor.readline(&prompt) {
            Ok(line) => line,
            Err(ReadlineError::Interrupted) => {
                if reader.in_block() {
                    reader.discard_block();
                    lines.clear();
                    repl.note("(the \"\"\" block was discarded)");
                } else if !empty_line.load(Ordering::SeqCst) {
                    // Ctrl-C on a line with text just clears it.
                    leaving = false;
                } else if leaving {
                    return Ok(());
                } else {
                    leaving = true;
                    repl.note("(Ctrl-C again to leave, or Ctrl-D, or /exit)");
                }
                continue;
            }
            Err(ReadlineError::Eof) => {
                // Leave the shell's prompt on a line of its own.
                print_flush("\n")?;
                return Ok(());
            }
            Err(e) => return Err(e.into()),
        };
        leaving = false;
        // A recalled multi-line entry arrives as one line with newlines in it.
        for part in line.split('\n') {
            lines.push(part.to_string());
            let Some(input) = reader.feed(part) else { continue };
            let entry = std::mem::take(&mut lines).join("\n");
            if let Some(path) = &history {
                record(&mut editor, path, &entry, repl);
            }
            if repl.handle(input)? == Flow::Exit {
                return Ok(());
            }
        }
        if !reader.in_block() {
            lines.clear();
        }
    }
}

/// Loads the history file, creating its directory (and the file, private to the user) if need be.
fn open_history(editor: &mut Editor<ChatHelper, FileHistory>, path: &Path) -> anyhow::Result<()> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    if path.exists() {
        editor.load_history(path)?;
    }
    Ok(())
}

/// Adds an input to the history and appends it to the file at once, so that it survives however the REPL ends.
/// (rustyline writes the file with mode 0600.)
fn record(editor: &mut Editor<ChatHelper, FileHistory>, path: &Path, entry: &str, repl: &Repl<'_>) {
    let saved = editor.add_history_entry(entry).and_then(|_| editor.append_history(path));
    if let Err(e) = saved {
        repl.warn(&format!("note: could not write the input history {}: {e}", path.display()));
    }
}
