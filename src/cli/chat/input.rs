//! Turning lines of input into messages and commands: one message per line, or a block of lines between `"""`
//! lines (ollama's convention), and `/commands`. The same reader serves the terminal and piped stdin.

/// One complete input.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Input {
    /// A message for the model.
    Message(String),
    /// A line starting with `/` (without the slash).
    Command(String),
}

/// The `"""` that opens and closes a block of lines.
const FENCE: &str = "\"\"\"";

/// Collects lines into [`Input`]s.
#[derive(Debug, Default)]
pub struct LineReader {
    /// The lines of an open `"""` block.
    block: Option<Vec<String>>,
}

impl LineReader {
    pub fn new() -> LineReader {
        LineReader::default()
    }

    /// Whether a `"""` block is open (more lines are needed).
    pub fn in_block(&self) -> bool {
        self.block.is_some()
    }

    /// Forgets an open block (Ctrl-C at a continuation prompt).
    pub fn discard_block(&mut self) {
        self.block = None;
    }

    /// Takes one line (without its line ending). Returns an input when one is complete; a blank line, or a line
    /// inside a block, gives none.
    ///
    /// - `"""` at the start of a line opens a block (text after it is the block's first line) and a line that ends
    ///   with `"""` closes it (text before it is the last line); `"""text"""` on one line is a message by itself.
    /// - `/word ...` is a command; `//...` is a message that starts with one slash.
    pub fn feed(&mut self, line: &str) -> Option<Input> {
        let line = line.strip_suffix('\r').unwrap_or(line);
        if let Some(lines) = &mut self.block {
            let Some(last) = line.trim_end().strip_suffix(FENCE) else {
                lines.push(line.to_string());
                return None;
            };
            if !last.is_empty() {
                lines.push(last.to_string());
            }
            let text = self.block.take().expect("in a block").join("\n");
            return message(&text);
        }
        let trimmed = line.trim();
        if let Some(rest) = trimmed.strip_prefix(FENCE) {
            if let Some(whole) = rest.strip_suffix(FENCE) {
                return message(whole);
            }
            let first = rest.trim_start();
            self.block = Some(if first.is_empty() { Vec::new() } else { vec![first.to_string()] });
            return None;
        }
        if let Some(command) = trimmed.strip_prefix('/') {
            if command.starts_with('/') {
                return message(command);
            }
            return Some(Input::Command(command.to_string()));
        }
        message(trimmed)
    }

    /// The end of input: an open block becomes a message as it stands.
    pub fn finish(&mut self) -> Option<Input> {
        let text = self.block.take()?.join("\n");
        message(&text)
    }
}

/// A message, unless it is blank. Surrounding blank lines and spaces are not part of it.
fn message(text: &str) -> Option<Input> {
    let text = text.trim();
    (!text.is_empty()).then(|| Input::Message(text.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn all(lines: &[&str]) -> Vec<Input> {
        let mut r = LineReader::new();
        let mut out: Vec<Input> = lines.iter().filter_map(|l| r.feed(l)).collect();
        out.extend(r.finish());
        out
    }

    fn m(s: &str) -> Input {
        Input::Message(s.into())
    }

    #[test]
    fn lines_blocks_and_commands() {
        assert_eq!(
            all(&["hello", "", "  ", "/help", "world\r"]),
            [m("hello"), Input::Command("help".into()), m("world")]
        );
        assert_eq!(all(&["\"\"\"", "line 1", "", "line 3", "\"\"\"", "after"]), [m("line 1\n\nline 3"), m("after")]);
        assert_eq!(all(&["\"\"\"first", "/not a command", "last\"\"\""]), [m("first\n/not a command\nlast")]);
        assert_eq!(all(&["\"\"\"one line\"\"\""]), [m("one line")]);
        assert_eq!(all(&["\"\"\"", "  \"\"\"  "]), []);
        assert_eq!(all(&["//etc/hosts is a path"]), [m("/etc/hosts is a path")]);
        assert_eq!(all(&["\"\"\"", "never closed"]), [m("never closed")]);
        let mut r = LineReader::new();
        assert_eq!(r.feed("\"\"\""), None);
        assert!(r.in_block());
        r.discard_block();
        assert_eq!(r.feed("x"), Some(m("x")));
    }
}
