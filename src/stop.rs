//! Stop strings (`--stop STR`, repeatable): ending generation when the text contains one of them.
//!
//! Text arrives one token's worth at a time, so a stop string can be split over many chunks. [`StopMatcher::push`]
//! returns the text that is safe to show now and holds back the longest tail that could still grow into a stop
//! string; when a stop string completes it reports [`StopStep::Stopped`] with the text before it. The stop string
//! itself is never part of the output. At the end of generation, [`StopMatcher::finish`] releases what is held.
//!
//! "First occurrence" means the first stop string to *complete* as the text streams in, since generation ends right
//! there (with stops `"abcd"` and `"bc"`, the text `"abcd"` stops after `"abc"`, printing `"a"`); among stop strings
//! completing at the same point the longest wins. The result never depends on how the text was cut into chunks.
//!
//! Works on `&str`: the streaming detokenizer upstream never yields half a character.

/// `--stop`: any non-empty string, with backslash escapes, since a newline is awkward to type in a shell:
/// `\n`, `\t`, `\r`, `\0`, `\\`, `\"`, `\'`, `\xHH` (ASCII) and `\u{HEX}`. Any other escape is refused by name, so
/// that a typo does not silently become part of the string.
pub fn parse_stop(text: &str) -> Result<String, String> {
    let stop = unescape(text).map_err(|e| format!("stop string '{text}': {e}"))?;
    if stop.is_empty() { Err("a stop string cannot be empty".into()) } else { Ok(stop) }
}

/// Resolves the backslash escapes listed at [`parse_stop`] (also used for DRY's sequence breakers).
pub fn unescape(text: &str) -> Result<String, String> {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        if c != '\\' {
            out.push(c);
            continue;
        }
        let e = chars.next().ok_or("it ends in a lone backslash (write \\\\ for a backslash)")?;
        out.push(match e {
            'n' => '\n',
            't' => '\t',
            'r' => '\r',
            '0' => '\0',
            '\\' | '"' | '\'' => e,
            'x' => {
                let hex: String = chars.by_ref().take(2).collect();
                match u8::from_str_radix(&hex, 16) {
                    Ok(b) if hex.len() == 2 && b.is_ascii() => char::from(b),
                    _ => return Err(format!("'\\x{hex}' is not an ASCII escape (\\x00 to \\x7F)")),
                }
            }
            'u' => {
                let rest = chars.as_str();
                let body = rest.strip_prefix('{').and_then(|r| r.split_once('}')).map(|(h, _)| h);
                let c =
                    body.and_then(|h| (1..=6).contains(&h.len()).then(|| u32::from_str_radix(h, 16).ok()).flatten());
                match (body, c.and_then(char::from_u32)) {
                    (Some(h), Some(c)) => {
                        chars = rest[h.len() + 2..].chars();
                        c
                    }
                    _ => return Err("'\\u' must be followed by {HEX}, a Unicode scalar value such as \\u{2028}".into()),
                }
            }
            other => {
                return Err(format!("'\\{other}' is not an escape this option knows (write \\\\ for a backslash)"));
            }
        });
    }
    Ok(out)
}

/// Why a set of stop strings was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StopError {
    /// An empty stop string would stop before the first token.
    #[error("stop string {index} is empty")]
    Empty { index: usize },
}

/// What to do after a chunk: print `text`, and stop or go on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StopStep<'a> {
    /// Print `text` (possibly empty: the chunk may be held back) and keep generating.
    Continue(&'a str),
    /// Print `text`, the output before the stop string, and end generation; `stop` is the index of the stop
    /// string that matched. Every later push returns `Stopped` with empty text.
    Stopped { text: &'a str, stop: usize },
}

/// Scans streamed text for stop strings; one per request.
#[derive(Debug, Clone, Default)]
pub struct StopMatcher {
    stops: Vec<String>,
    /// Text received but not yet released: always a proper prefix of some stop string, before new text arrives.
    held: String,
    out: String,
    stopped: Option<usize>,
}

/// Checks stop strings without building a matcher: none may be empty.
pub fn validate_stops<S: AsRef<str>>(stops: &[S]) -> Result<(), StopError> {
    match stops.iter().position(|s| s.as_ref().is_empty()) {
        Some(index) => Err(StopError::Empty { index }),
        None => Ok(()),
    }
}

impl StopMatcher {
    /// A matcher for `stops` (no stop strings is fine: everything passes straight through).
    pub fn new<I, S>(stops: I) -> Result<Self, StopError>
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        let stops: Vec<String> = stops.into_iter().map(Into::into).collect();
        validate_stops(&stops)?;
        Ok(StopMatcher { stops, ..Self::default() })
    }

    pub fn stops(&self) -> &[String] {
        &self.stops
    }

    /// Whether token `id` is a control token that one of the stop strings spells. Control tokens decode to nothing,
    /// so a stop string naming one (`--stop "<|im_start|>"`, for a template whose turns end in a token that does
    /// not end generation) could never match the text: it is matched against the token instead.
    pub fn names_control_token(&self, tokenizer: &crate::tokenizer::Tokenizer, id: u32) -> bool {
        !self.stops.is_empty()
            && tokenizer.token_type(id) == Some(crate::tokenizer::TokenType::Control)
            && tokenizer.token_text(id).is_some_and(|t| self.stops.iter().any(|s| s == t))
    }

    /// The index of the stop string that ended generation, if one has.
    pub fn stopped(&self) -> Option<usize> {
        self.stopped
    }

    /// Text received but held back because it may begin a stop string.
    pub fn held(&self) -> &str {
        &self.held
    }

    /// Forgets all text and the stopped state, keeping the stop strings (for the next request).
    pub fn reset(&mut self) {
        self.held.clear();
        self.out.clear();
        self.stopped = None;
    }

    /// Feeds the next chunk of decoded text.
    pub fn push(&mut self, chunk: &str) -> StopStep<'_> {
        if let Some(stop) = self.stopped {
            return StopStep::Stopped { text: "", stop };
        }
        self.out.clear();
        self.held.push_str(chunk);

        // The stop string that completes first; on a tie of end positions the longest one (earliest start).
        let mut hit: Option<(usize, usize, usize)> = None; // (end, start, stop index)
        for (index, stop) in self.stops.iter().enumerate() {
            if let Some(start) = self.held.find(stop.as_str()) {
                let end = start + stop.len();
                if hit.is_none_or(|(e, s, _)| (end, start) < (e, s)) {
                    hit = Some((end, start, index));
                }
            }
        }
        if let Some((_, start, stop)) = hit {
            self.out.push_str(&self.held[..start]);
            self.held.clear();
            self.stopped = Some(stop);
            return StopStep::Stopped { text: &self.out, stop };
        }

        // No stop string yet: keep the longest tail that some stop string starts with; release the rest.
        let keep_from = self.hold_from();
        self.out.push_str(&self.held[..keep_from]);
        self.held.replace_range(..keep_from, "");
        StopStep::Continue(&self.out)
    }

    /// Ends the stream with its last chunk `rest` (what a UTF-8 decoder still held): the text still to show, and
    /// whether `rest` completed a stop string. Without a stop, that is `rest` and everything held back in case it
    /// began one (the matcher is then reset, as by [`finish`](Self::finish)); with one, only the text before it.
    pub fn finish_with(&mut self, rest: &str) -> (String, bool) {
        match self.push(rest) {
            StopStep::Continue(t) => {
                let t = t.to_string();
                (t + self.finish(), false)
            }
            StopStep::Stopped { text, .. } => (text.to_string(), true),
        }
    }

    /// Ends the stream: returns the held text (nothing once stopped) and resets the matcher.
    pub fn finish(&mut self) -> &str {
        self.out.clear();
        if self.stopped.is_none() {
            std::mem::swap(&mut self.out, &mut self.held);
        }
        self.held.clear();
        self.stopped = None;
        &self.out
    }

    /// The smallest index whose tail of `held` is a prefix of some stop string (`held.len()` if none is).
    fn hold_from(&self) -> usize {
        let text = self.held.as_bytes();
        let longest = self.stops.iter().map(String::len).max().unwrap_or(0);
        // A full stop string would have matched, so the tail is shorter than the longest stop string.
        let first = text.len().saturating_sub(longest.saturating_sub(1));
        (first..text.len())
            .filter(|&i| self.held.is_char_boundary(i))
            .find(|&i| self.stops.iter().any(|stop| stop.as_bytes().starts_with(&text[i..])))
            .unwrap_or(text.len())
    }
}
